"""Layer 2, reporting: result records (validated, atomic, hashed), the leaderboard and its plots, and the
published numbers with their sources. Reads records; never trains or decodes."""
