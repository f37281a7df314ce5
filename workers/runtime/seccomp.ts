/**
 * The default seccomp profile of a box, in OCI runtime-spec form. It follows the policy of
 * Docker's default profile: everything not listed fails with EPERM; the listed system calls
 * are allowed; calls that need a capability a box does not have (mount, unshare, setns, bpf,
 * keyctl, …) stay blocked; `clone` is allowed only without namespace flags, and `clone3`
 * answers ENOSYS so that libcs fall back to `clone`. io_uring (`io_uring_setup`, `_enter`,
 * `_register`) is left out, as Docker ≥ 25 does: its operations bypass seccomp itself and it
 * has been the source of a long run of kernel privilege escalations.
 *
 * Names that the host's libseccomp does not know are skipped by runc, so the list may name
 * newer calls.
 */

export interface SeccompArg {
  index: number;
  value: number;
  valueTwo?: number;
  op: 'SCMP_CMP_NE' | 'SCMP_CMP_LT' | 'SCMP_CMP_LE' | 'SCMP_CMP_EQ' | 'SCMP_CMP_GE' | 'SCMP_CMP_GT' | 'SCMP_CMP_MASKED_EQ';
}

export interface SeccompSyscall {
  names: string[];
  action: 'SCMP_ACT_ALLOW' | 'SCMP_ACT_ERRNO' | 'SCMP_ACT_KILL';
  errnoRet?: number;
  args?: SeccompArg[];
}

export interface SeccompProfile {
  defaultAction: 'SCMP_ACT_ERRNO';
  defaultErrnoRet: number;
  architectures: string[];
  syscalls: SeccompSyscall[];
}

const EPERM = 1;
const ENOSYS = 38;
/** CLONE_NEWNS|CLONE_NEWCGROUP|CLONE_NEWUTS|CLONE_NEWIPC|CLONE_NEWUSER|CLONE_NEWPID|CLONE_NEWNET. */
const CLONE_NAMESPACE_FLAGS = 0x7e020000;
const AF_VSOCK = 40;

/** Allowed without conditions (a box has Docker's default capabilities, no CAP_SYS_ADMIN). */
const ALLOWED = `
accept accept4 access adjtimex alarm bind brk capget capset chdir chmod chown chown32
clock_adjtime clock_adjtime64 clock_getres clock_getres_time64 clock_gettime clock_gettime64
clock_nanosleep clock_nanosleep_time64 close close_range connect copy_file_range creat dup dup2
dup3 epoll_create epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait
epoll_wait_old eventfd eventfd2 execve execveat exit exit_group faccessat faccessat2 fadvise64
fadvise64_64 fallocate fanotify_mark fchdir fchmod fchmodat fchown fchown32 fchownat fcntl
fcntl64 fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat fstat64 fstatat64
fstatfs fstatfs64 fsync ftruncate ftruncate64 futex futex_time64 futex_waitv futimesat getcpu
getcwd getdents getdents64 getegid getegid32 geteuid geteuid32 getgid getgid32 getgroups
getgroups32 getitimer getpeername getpgid getpgrp getpid getppid getpriority getrandom getresgid
getresgid32 getresuid getresuid32 getrlimit get_robust_list getrusage getsid getsockname
getsockopt get_thread_area gettid gettimeofday getuid getuid32 getxattr inotify_add_watch
inotify_init inotify_init1 inotify_rm_watch io_cancel ioctl io_destroy io_getevents
io_pgetevents io_pgetevents_time64 ioprio_get ioprio_set io_setup io_submit ipc landlock_add_rule landlock_create_ruleset
landlock_restrict_self lchown lchown32 lgetxattr link linkat listen listxattr llistxattr _llseek
lremovexattr lseek lsetxattr lstat lstat64 madvise membarrier memfd_create memfd_secret mincore
mkdir mkdirat mknod mknodat mlock mlock2 mlockall mmap mmap2 mprotect mq_getsetattr mq_notify
mq_open mq_timedreceive mq_timedreceive_time64 mq_timedsend mq_timedsend_time64 mq_unlink mremap
msgctl msgget msgrcv msgsnd msync munlock munlockall munmap name_to_handle_at nanosleep
newfstatat _newselect open openat openat2 pause pidfd_open pipe pipe2
pkey_alloc pkey_free pkey_mprotect poll ppoll ppoll_time64 prctl pread64 preadv preadv2
prlimit64 process_mrelease pselect6 pselect6_time64 pwrite64 pwritev pwritev2 read readahead
readlink readlinkat readv recv recvfrom recvmmsg recvmmsg_time64 recvmsg remap_file_pages
removexattr rename renameat renameat2 restart_syscall rmdir rseq rt_sigaction rt_sigpending
rt_sigprocmask rt_sigreturn rt_sigsuspend rt_sigtimedwait rt_sigtimedwait_time64
sched_getaffinity sched_getattr sched_getparam sched_get_priority_max
sched_get_priority_min sched_getscheduler sched_rr_get_interval sched_rr_get_interval_time64
sched_setaffinity sched_setattr sched_setparam sched_setscheduler sched_yield seccomp select
semctl semget semop semtimedop semtimedop_time64 send sendfile sendfile64 sendmmsg sendmsg sendto
setfsgid setfsgid32 setfsuid setfsuid32 setgid setgid32 setgroups setgroups32 setitimer setpgid
setpriority setregid setregid32 setresgid setresgid32 setresuid setresuid32 setreuid setreuid32
setrlimit set_robust_list setsid setsockopt set_thread_area set_tid_address setuid setuid32
setxattr shmat shmctl shmdt shmget shutdown sigaltstack signalfd signalfd4 sigprocmask sigreturn
socketcall socketpair splice stat stat64 statfs statfs64 statx symlink symlinkat sync
sync_file_range syncfs sysinfo tee time timer_create timer_delete timer_getoverrun
timer_gettime timer_gettime64 timer_settime timer_settime64 timerfd_create timerfd_gettime
timerfd_gettime64 timerfd_settime timerfd_settime64 times truncate truncate64 ugetrlimit
umask uname unlink unlinkat utime utimensat utimensat_time64 utimes vfork vmsplice wait4 waitid
waitpid write writev
ptrace process_vm_readv process_vm_writev
chroot
`.trim().split(/\s+/);

/** Per-architecture additions (names as Node's process.arch spells them). */
const ARCH_ALLOWED: Record<string, string[]> = {
  x64: ['arch_prctl', 'modify_ldt'],
  ia32: ['modify_ldt'],
  arm64: ['arm_fadvise64_64', 'arm_sync_file_range', 'sync_file_range2', 'breakpoint', 'cacheflush', 'set_tls'],
  arm: ['arm_fadvise64_64', 'arm_sync_file_range', 'sync_file_range2', 'breakpoint', 'cacheflush', 'set_tls'],
};

const ARCHITECTURES: Record<string, string[]> = {
  x64: ['SCMP_ARCH_X86_64'],
  ia32: ['SCMP_ARCH_X86'],
  arm64: ['SCMP_ARCH_AARCH64'],
  arm: ['SCMP_ARCH_ARM'],
};
const COMPAT_ARCHITECTURES: Record<string, string[]> = {
  x64: ['SCMP_ARCH_X86', 'SCMP_ARCH_X32'],
  arm64: ['SCMP_ARCH_ARM'],
};

const LOW32 = 0xffffffff;

/**
 * `names` allowed when argument `index`, a 32-bit int (a pid, a socket family), is not `value`.
 * Seccomp compares all 64 bits of a register while the kernel reads only the low 32, so
 * `SCMP_CMP_NE` would let 0x1_0000_0001 through as 1: the low 32 bits are tested, one bit per rule
 * (rules of one call are ORed): any bit that differs from `value`'s.
 */
function lowWordNot(names: string[], index: number, value: number): SeccompSyscall[] {
  return Array.from({ length: 32 }, (_, bit) => {
    const mask = 2 ** bit;
    return { names, action: 'SCMP_ACT_ALLOW' as const, args: [{ index, value: mask, valueTwo: Math.floor(value / mask) % 2 === 1 ? 0 : mask, op: 'SCMP_CMP_MASKED_EQ' as const }] };
  });
}

/**
 * The box seccomp profile for this host's architecture. Unlike Docker's, it names only the
 * native architecture unless `compat32` is set: runc compiles the filter again for every
 * exec, and each extra architecture costs about 10 ms per exec here; a 32-bit system call
 * from a box is then refused by the filter.
 */
export function defaultSeccompProfile(arch: string = process.arch, opts: { compat32?: boolean } = {}): SeccompProfile {
  const personalities = [0, 8, 0x20000, 0x20008, 0xffffffff];
  return {
    defaultAction: 'SCMP_ACT_ERRNO',
    defaultErrnoRet: EPERM,
    architectures: [...(ARCHITECTURES[arch] ?? []), ...(opts.compat32 ? COMPAT_ARCHITECTURES[arch] ?? [] : [])],
    syscalls: [
      { names: [...ALLOWED, ...(ARCH_ALLOWED[arch] ?? [])], action: 'SCMP_ACT_ALLOW' },
      // Any socket family but AF_VSOCK.
      ...lowWordNot(['socket'], 0, AF_VSOCK),
      // personality(2) only for the harmless personas (Linux, UNAME26, READ_IMPLIES_EXEC, query).
      ...personalities.map((p): SeccompSyscall => ({
        names: ['personality'],
        action: 'SCMP_ACT_ALLOW',
        args: [{ index: 0, value: p, op: 'SCMP_CMP_EQ' }],
      })),
      // clone(2) without namespace flags (fork, threads). s390 swaps the first two arguments;
      // boxhost does not run there.
      {
        names: ['clone'],
        action: 'SCMP_ACT_ALLOW',
        args: [{ index: 0, value: CLONE_NAMESPACE_FLAGS, valueTwo: 0, op: 'SCMP_CMP_MASKED_EQ' }],
      },
      // clone3 passes its flags in memory, where seccomp cannot look: make it "not implemented"
      // so that glibc and musl fall back to clone(2).
      { names: ['clone3'], action: 'SCMP_ACT_ERRNO', errnoRet: ENOSYS },
      // Signals that carry a sender-made siginfo (or name a thread) would reach boxd, the box's
      // PID 1, as something other than kill(2)'s SI_USER, which Go's runtime takes for a real
      // fault and dies of (a SIGSEGV queued at pid 1 stopped the box). So: none aimed at pid 1;
      // tkill (obsolete: libcs use tgkill) not at all.
      ...lowWordNot(['tgkill', 'rt_sigqueueinfo', 'rt_tgsigqueueinfo'], 0, 1),
      // kill(2) at pid 1 only as the probe (signal 0): a burst of signals at boxd killed it now and
      // then with signal 34, a realtime signal Go's runtime leaves at its default (found
      // 2026-11-24: 2 boxes of 12 stopped by `for s in 1…64: kill -$s 1`). The box is stopped
      // through the API, never from inside.
      ...lowWordNot(['kill'], 0, 1),
      { names: ['kill'], action: 'SCMP_ACT_ALLOW', args: [{ index: 0, value: LOW32, valueTwo: 1, op: 'SCMP_CMP_MASKED_EQ' }, { index: 1, value: LOW32, valueTwo: 0, op: 'SCMP_CMP_MASKED_EQ' }] },
      // pidfd_send_signal reaches any pid a pidfd (or a /proc/<pid> directory) names, pid 1 too,
      // and the pid behind a descriptor is not an argument seccomp can read: "not implemented",
      // as on kernels before 5.1, so that programs fall back to kill(2) (Go's os package, systemd).
      { names: ['pidfd_send_signal'], action: 'SCMP_ACT_ERRNO', errnoRet: ENOSYS },
    ],
  };
}
