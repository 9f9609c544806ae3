"""The first code a sandboxed program's process runs (tasks/graders/sandbox.py): inside its new namespaces, before the
program. Standard library only; run as ``python -I -S _sandbox_init.py SPEC``.

It builds the program's whole filesystem, then gives up every privilege and becomes the program:

1. the mount namespace is made private (nothing mounted here reaches the host);
2. a new root on an empty tmpfs: ``/usr`` and the interpreter's installation bound read-only, ``/bin``, ``/lib``,
   ``/lib64`` as links into ``/usr``, ``/dev/null`` / ``/dev/zero`` / ``/dev/urandom``, and ``/work``, a small
   writable tmpfs holding the program and its files; ``pivot_root`` into it and the old root detached, so no path
   leads back to the host's files; the new root made read-only;
3. as root (the harness ran as root): the groups cleared and the uid and gid changed to the sandbox's own
   unprivileged ids, which drops every capability; in a user namespace (the harness ran as a user): the capability
   bounding set emptied and the capabilities cleared;
4. no new privileges (``PR_SET_NO_NEW_PRIVS``), the resource limits set, on x86-64 a seccomp filter that refuses
   the calls that make namespaces, mounts, traces or kernel objects a process of this kind never needs (an
   unprivileged process may still create a user namespace on many kernels, and gain capabilities inside it), then
   ``exec`` of the interpreter on the program, in ``/work``, with a clean environment.
"""

import ctypes
import json
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24
SYS_PIVOT_ROOT = 155  # x86_64
LIBC = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _mount(source: str | None, target: str, kind: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    _check(LIBC.mount(encode(source), encode(target), encode(kind), flags, encode(data)), f"mount {target}")


def _bind(source: str, root: str, *, is_file: bool = False) -> None:
    target = root + source
    if is_file:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "w").close()
    else:
        os.makedirs(target, exist_ok=True)
    _mount(source, target, None, MS_BIND | MS_REC)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (0 if is_file else MS_NODEV))


def _new_root(spec: dict) -> None:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    root = "/tmp/.sandbox-root"  # a mount point in this namespace only
    os.makedirs(root, exist_ok=True)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for directory in ("/usr", spec["prefix"]):
        _bind(directory, root)
    for link in ("bin", "lib", "lib64", "sbin"):
        os.symlink(f"usr/{link}", f"{root}/{link}")
    for device in ("/dev/null", "/dev/zero", "/dev/urandom"):
        _bind(device, root, is_file=True)
    os.makedirs(f"{root}/work")
    _mount("tmpfs", f"{root}/work", "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['workdir_bytes']},mode=700")
    with open(f"{root}/work/program.py", "w") as out:
        out.write(spec["source"])
    for name, text in spec["files"].items():
        with open(f"{root}/work/{name}", "w") as out:
            out.write(text)
    if spec["uid"] is not None:
        for path in ("work", "work/program.py", *(f"work/{name}" for name in spec["files"])):
            os.chown(f"{root}/{path}", spec["uid"], spec["uid"])
    os.makedirs(f"{root}/.old")
    _check(LIBC.syscall(SYS_PIVOT_ROOT, root.encode(), f"{root}/.old".encode()), "pivot_root")
    os.chdir("/")
    _check(LIBC.umount2(b"/.old", MNT_DETACH), "umount the old root")
    os.rmdir("/.old")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _drop_privileges(uid: int | None) -> None:
    if uid is not None:  # root outside: become the sandbox's own user (capabilities go with root)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    else:  # root of a user namespace: no capability left, none regained on exec
        for capability in range(64):
            LIBC.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words: all empty
        _check(LIBC.capset(header, data), "capset")
    _check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


# seccomp (x86-64): calls refused with EPERM; clone with a namespace flag too; clone3 ENOSYS (libc falls back to clone,
# whose flags the filter can read).
DENIED = {
    "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "ptrace": 101,
    "process_vm_readv": 310, "process_vm_writev": 311, "keyctl": 250, "add_key": 248, "request_key": 249,
    "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320, "reboot": 169, "swapon": 167, "swapoff": 168,
    "acct": 163, "quotactl": 179, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "name_to_handle_at": 303, "open_by_handle_at": 304,
}  # fmt: skip
CLONE, CLONE3 = 56, 435
CLONE_NAMESPACES = 0x7E020080  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
LOAD, JEQ, JSET, RETURN = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JSET|K, BPF_RET|K
ALLOW, KILL = 0x7FFF0000, 0x80000000
EPERM, ENOSYS = 0x00050000 | 1, 0x00050000 | 38  # SECCOMP_RET_ERRNO | errno
AUDIT_ARCH_X86_64 = 0xC000003E
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def _seccomp_program() -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k); jumps count the instructions skipped (BPF jumps only forward)."""
    numbers = sorted(DENIED.values())
    head = [(LOAD, 0, 0, 4), (JEQ, 1, 0, AUDIT_ARCH_X86_64), (RETURN, 0, 0, KILL), (LOAD, 0, 0, 0)]
    checks = len(numbers) + 2  # the denied calls, clone, clone3
    # after the checks: [allow] [load flags] [jset] [allow] [EPERM] [ENOSYS]
    allow, clone_check, deny, nosys = checks, checks + 1, checks + 4, checks + 5
    body = [(JEQ, deny - i - 1, 0, number) for i, number in enumerate(numbers)]
    body += [(JEQ, clone_check - len(body) - 1, 0, CLONE), (JEQ, nosys - len(body) - 2, 0, CLONE3)]
    body += [(RETURN, 0, 0, ALLOW), (LOAD, 0, 0, 16), (JSET, 1, 0, CLONE_NAMESPACES), (RETURN, 0, 0, ALLOW)]
    body += [(RETURN, 0, 0, EPERM), (RETURN, 0, 0, ENOSYS)]
    assert len(body) == nosys + 1 and allow == len(numbers) + 2
    return head + body


def _install_seccomp() -> None:
    if os.uname().machine != "x86_64":
        return  # the call numbers above are x86-64's
    program = _seccomp_program()
    filters = (_Filter * len(program))(*(_Filter(*instruction) for instruction in program))
    fprog = _Program(len(program), filters)
    _check(LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def main() -> None:
    spec = json.loads(sys.argv[1])
    _new_root(spec)
    _drop_privileges(spec["uid"])
    for name, value in spec["limits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    os.chdir("/work")
    _install_seccomp()
    environment = {"PATH": "/usr/bin:/bin", "HOME": "/work", "TMPDIR": "/work", "LANG": "C.UTF-8"}
    environment["PYTHONHASHSEED"] = "0"
    os.execve(spec["python"], [spec["python"], "-I", "-S", "-B", "program.py"], environment)


if __name__ == "__main__":
    main()
