"""One exception type for problems the user can fix (bad config, missing path, unknown name).

The command line prints its message as a single line and exits with status 2; anything else is a bug and keeps
its traceback.
"""


class UserError(Exception):
    """A problem with the user's input, reported as one clear line."""
