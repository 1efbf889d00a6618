//! The system calls the filter lets through and the ones it refuses by name, by number for the
//! architecture podhost is built for (`x86_64`, `aarch64`, `riscv64`: those seccompiler knows).
//!
//! The allowed calls are Docker's default profile (moby's `profiles/seccomp/default.json`) for
//! a container holding Docker's default capabilities: its unconditional list, `ptrace` and
//! `process_vm_{readv,writev}` (allowed on kernels since 4.8), `arch_prctl` and `modify_ldt`
//! on x86-64, and `chroot` (`CAP_SYS_CHROOT` is one of Docker's default capabilities and of
//! [`ROOT_KEEPS`](super::super::ROOT_KEEPS); the kernel still refuses it to a command without it).
//! Calls Docker gives only to holders of another capability (`CAP_SYS_ADMIN`, `CAP_SYS_MODULE`,
//! `CAP_SYS_BOOT`, …) are refused: podhost's commands hold none of those. `socket`,
//! `socketpair`, `clone` and `personality` depend on their arguments (see `super`); `clone3` is
//! answered `ENOSYS` (glibc then uses `clone`, whose flags the filter can see).
//!
//! Numbers come from `libc`; the few it does not name yet are written out here (a name defined
//! in the module shadows the glob import, so a newer `libc` changes nothing). From 424 on, every
//! architecture numbers a new call alike.

/// `(name, number)` for each system-call constant named.
macro_rules! calls {
    ($($nr:ident),* $(,)?) => {
        &[$((stringify!($nr), $nr)),*]
    };
}

/// The calls allowed on every architecture, unconditionally.
#[rustfmt::skip]
macro_rules! common_allowed {
    () => {
        calls![
            SYS_accept, SYS_accept4, SYS_adjtimex, SYS_bind, SYS_brk, SYS_cachestat, SYS_capget,
            SYS_capset, SYS_chdir, SYS_clock_adjtime, SYS_clock_getres, SYS_clock_gettime,
            SYS_clock_nanosleep, SYS_close, SYS_close_range, SYS_connect, SYS_copy_file_range,
            SYS_dup, SYS_dup3, SYS_epoll_create1, SYS_epoll_ctl, SYS_epoll_pwait, SYS_epoll_pwait2,
            SYS_eventfd2, SYS_execve, SYS_execveat, SYS_exit, SYS_exit_group, SYS_faccessat,
            SYS_faccessat2, SYS_fadvise64, SYS_fallocate, SYS_fanotify_mark, SYS_fchdir, SYS_fchmod,
            SYS_fchmodat, SYS_fchmodat2, SYS_fchown, SYS_fchownat, SYS_fcntl, SYS_fdatasync,
            SYS_fgetxattr, SYS_flistxattr, SYS_flock, SYS_fremovexattr, SYS_fsetxattr, SYS_fstat,
            SYS_fstatfs, SYS_fsync, SYS_ftruncate, SYS_futex, SYS_futex_requeue, SYS_futex_wait,
            SYS_futex_waitv, SYS_futex_wake, SYS_getcpu, SYS_getcwd, SYS_getdents64, SYS_getegid,
            SYS_geteuid, SYS_getgid, SYS_getgroups, SYS_getitimer, SYS_getpeername, SYS_getpgid,
            SYS_getpid, SYS_getppid, SYS_getpriority, SYS_getrandom, SYS_getresgid, SYS_getresuid,
            SYS_getrlimit, SYS_get_robust_list, SYS_getrusage, SYS_getsid, SYS_getsockname,
            SYS_getsockopt, SYS_gettid, SYS_gettimeofday, SYS_getuid, SYS_getxattr, SYS_getxattrat,
            SYS_inotify_add_watch, SYS_inotify_init1, SYS_inotify_rm_watch, SYS_io_cancel,
            SYS_ioctl, SYS_io_destroy, SYS_io_getevents, SYS_io_pgetevents, SYS_ioprio_get,
            SYS_ioprio_set, SYS_io_setup, SYS_io_submit, SYS_kill, SYS_landlock_add_rule,
            SYS_landlock_create_ruleset, SYS_landlock_restrict_self, SYS_lgetxattr, SYS_linkat,
            SYS_listen, SYS_listmount, SYS_listxattr, SYS_listxattrat, SYS_llistxattr,
            SYS_lremovexattr, SYS_lseek, SYS_lsetxattr, SYS_madvise, SYS_map_shadow_stack,
            SYS_membarrier, SYS_memfd_create, SYS_memfd_secret, SYS_mincore, SYS_mkdirat,
            SYS_mknodat, SYS_mlock, SYS_mlock2, SYS_mlockall, SYS_mmap, SYS_mprotect,
            SYS_mq_getsetattr, SYS_mq_notify, SYS_mq_open, SYS_mq_timedreceive, SYS_mq_timedsend,
            SYS_mq_unlink, SYS_mremap, SYS_mseal, SYS_msgctl, SYS_msgget, SYS_msgrcv, SYS_msgsnd,
            SYS_msync, SYS_munlock, SYS_munlockall, SYS_munmap, SYS_name_to_handle_at,
            SYS_nanosleep, SYS_newfstatat, SYS_openat, SYS_openat2, SYS_pidfd_open,
            SYS_pidfd_send_signal, SYS_pipe2, SYS_pkey_alloc, SYS_pkey_free, SYS_pkey_mprotect,
            SYS_ppoll, SYS_prctl, SYS_pread64, SYS_preadv, SYS_preadv2, SYS_prlimit64,
            SYS_process_mrelease, SYS_pselect6, SYS_pwrite64, SYS_pwritev, SYS_pwritev2, SYS_read,
            SYS_readahead, SYS_readlinkat, SYS_readv, SYS_recvfrom, SYS_recvmmsg, SYS_recvmsg,
            SYS_remap_file_pages, SYS_removexattr, SYS_removexattrat, SYS_renameat, SYS_renameat2,
            SYS_restart_syscall, SYS_rseq, SYS_rt_sigaction, SYS_rt_sigpending, SYS_rt_sigprocmask,
            SYS_rt_sigqueueinfo, SYS_rt_sigreturn, SYS_rt_sigsuspend, SYS_rt_sigtimedwait,
            SYS_rt_tgsigqueueinfo, SYS_sched_getaffinity, SYS_sched_getattr, SYS_sched_getparam,
            SYS_sched_get_priority_max, SYS_sched_get_priority_min, SYS_sched_getscheduler,
            SYS_sched_rr_get_interval, SYS_sched_setaffinity, SYS_sched_setattr, SYS_sched_setparam,
            SYS_sched_setscheduler, SYS_sched_yield, SYS_seccomp, SYS_semctl, SYS_semget, SYS_semop,
            SYS_semtimedop, SYS_sendfile, SYS_sendmmsg, SYS_sendmsg, SYS_sendto, SYS_setfsgid,
            SYS_setfsuid, SYS_setgid, SYS_setgroups, SYS_setitimer, SYS_setpgid, SYS_setpriority,
            SYS_setregid, SYS_setresgid, SYS_setresuid, SYS_setreuid, SYS_setrlimit,
            SYS_set_robust_list, SYS_setsid, SYS_setsockopt, SYS_set_tid_address, SYS_setuid,
            SYS_setxattr, SYS_setxattrat, SYS_shmat, SYS_shmctl, SYS_shmdt, SYS_shmget,
            SYS_shutdown, SYS_sigaltstack, SYS_signalfd4, SYS_splice, SYS_statfs, SYS_statmount,
            SYS_statx, SYS_symlinkat, SYS_sync, SYS_sync_file_range, SYS_syncfs, SYS_sysinfo,
            SYS_tee, SYS_tgkill, SYS_timer_create, SYS_timer_delete, SYS_timer_getoverrun,
            SYS_timer_gettime, SYS_timer_settime, SYS_timerfd_create, SYS_timerfd_gettime,
            SYS_timerfd_settime, SYS_times, SYS_tkill, SYS_truncate, SYS_umask, SYS_uname,
            SYS_unlinkat, SYS_utimensat, SYS_vmsplice, SYS_wait4, SYS_waitid, SYS_write, SYS_writev,
            SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev, SYS_chroot,
        ]
    };
}

/// The calls refused (`EPERM`) on every architecture, by name: the default answer for any call
/// not allowed, listed so that the tests can name each one.
#[rustfmt::skip]
macro_rules! common_refused {
    () => {
        calls![
            SYS_add_key, SYS_request_key, SYS_keyctl, SYS_bpf, SYS_userfaultfd, SYS_perf_event_open,
            SYS_io_uring_setup, SYS_io_uring_enter, SYS_io_uring_register, SYS_kexec_load,
            SYS_kexec_file_load, SYS_open_by_handle_at, SYS_init_module, SYS_finit_module,
            SYS_delete_module, SYS_mount, SYS_umount2, SYS_pivot_root, SYS_open_tree,
            SYS_move_mount, SYS_fsopen, SYS_fsconfig, SYS_fsmount, SYS_fspick, SYS_mount_setattr,
            SYS_swapon, SYS_swapoff, SYS_reboot, SYS_acct, SYS_settimeofday, SYS_clock_settime,
            SYS_lookup_dcookie, SYS_quotactl, SYS_quotactl_fd, SYS_nfsservctl, SYS_syslog,
            SYS_unshare, SYS_setns, SYS_fanotify_init, SYS_sethostname, SYS_setdomainname,
            SYS_vhangup, SYS_get_mempolicy, SYS_set_mempolicy, SYS_mbind, SYS_migrate_pages,
            SYS_move_pages, SYS_set_mempolicy_home_node, SYS_kcmp, SYS_pidfd_getfd,
            SYS_process_madvise, SYS_lsm_get_self_attr, SYS_lsm_set_self_attr, SYS_lsm_list_modules,
        ]
    };
}

/// Numbers from 424 on that `libc` does not name yet (the same on every architecture).
macro_rules! unified_numbers {
    () => {
        pub const SYS_cachestat: i64 = 451;
        pub const SYS_map_shadow_stack: i64 = 453;
        pub const SYS_futex_wake: i64 = 454;
        pub const SYS_futex_wait: i64 = 455;
        pub const SYS_futex_requeue: i64 = 456;
        pub const SYS_statmount: i64 = 457;
        pub const SYS_listmount: i64 = 458;
        pub const SYS_lsm_get_self_attr: i64 = 459;
        pub const SYS_lsm_set_self_attr: i64 = 460;
        pub const SYS_lsm_list_modules: i64 = 461;
        pub const SYS_setxattrat: i64 = 463;
        pub const SYS_getxattrat: i64 = 464;
        pub const SYS_listxattrat: i64 = 465;
        pub const SYS_removexattrat: i64 = 466;
    };
}

#[cfg(target_arch = "x86_64")]
#[allow(non_upper_case_globals)]
#[rustfmt::skip]
mod arch {
    pub use libc::*;
    unified_numbers!();
    pub const SYS_io_pgetevents: i64 = 333;
    pub const SYS_uretprobe: i64 = 335;
    pub const SYS_create_module: i64 = 174;
    pub const SYS_get_kernel_syms: i64 = 177;
    pub const SYS_query_module: i64 = 178;

    pub const ALLOWED: [&[(&str, i64)]; 2] = [common_allowed!(), calls![
        SYS_access, SYS_alarm, SYS_chmod, SYS_chown, SYS_creat, SYS_dup2, SYS_epoll_create,
        SYS_epoll_ctl_old, SYS_epoll_wait, SYS_epoll_wait_old, SYS_eventfd, SYS_fork, SYS_futimesat,
        SYS_getdents, SYS_getpgrp, SYS_get_thread_area, SYS_inotify_init, SYS_lchown, SYS_link,
        SYS_lstat, SYS_mkdir, SYS_mknod, SYS_open, SYS_pause, SYS_pipe, SYS_poll, SYS_readlink,
        SYS_rename, SYS_rmdir, SYS_select, SYS_set_thread_area, SYS_signalfd, SYS_stat, SYS_symlink,
        SYS_time, SYS_unlink, SYS_uretprobe, SYS_utime, SYS_utimes, SYS_vfork, SYS_arch_prctl,
        SYS_modify_ldt
    ]];

    pub const REFUSED: [&[(&str, i64)]; 2] = [common_refused!(), calls![
        SYS_iopl, SYS_ioperm, SYS_uselib, SYS_ustat, SYS_sysfs, SYS__sysctl, SYS_create_module,
        SYS_get_kernel_syms, SYS_query_module, SYS_afs_syscall, SYS_tuxcall, SYS_security,
        SYS_vserver, SYS_getpmsg, SYS_putpmsg,
    ]];
}

/// aarch64 and riscv64 number their calls as asm-generic does.
#[cfg(any(target_arch = "aarch64", target_arch = "riscv64"))]
#[allow(non_upper_case_globals)]
#[rustfmt::skip]
mod arch {
    pub use libc::*;
    unified_numbers!();
    pub const SYS_renameat: i64 = 38;
    pub const SYS_sync_file_range: i64 = 84;
    pub const SYS_getrlimit: i64 = 163;
    pub const SYS_setrlimit: i64 = 164;
    pub const SYS_io_pgetevents: i64 = 292;
    pub const SYS_kexec_file_load: i64 = 294;
    pub const SYS_fchmodat2: i64 = 452;
    pub const SYS_mseal: i64 = 462;
    pub const SYS_riscv_hwprobe: i64 = 258;
    pub const SYS_riscv_flush_icache: i64 = 259;

    #[cfg(target_arch = "aarch64")]
    pub const ALLOWED: [&[(&str, i64)]; 2] = [common_allowed!(), &[]];
    #[cfg(target_arch = "riscv64")]
    pub const ALLOWED: [&[(&str, i64)]; 2] =
        [common_allowed!(), calls![SYS_riscv_hwprobe, SYS_riscv_flush_icache]];

    pub const REFUSED: [&[(&str, i64)]; 2] = [common_refused!(), &[]];
}

/// Elsewhere seccompiler builds no filter, and every command fails to start (see `super`).
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
)))]
mod arch {
    pub use libc::{
        SYS_clone, SYS_clone3, SYS_mount, SYS_mount_setattr, SYS_personality, SYS_socket,
        SYS_socketpair,
    };
    pub const ALLOWED: [&[(&str, i64)]; 2] = [&[], &[]];
    pub const REFUSED: [&[(&str, i64)]; 2] = [&[], &[]];
}

pub(super) use arch::{
    ALLOWED, REFUSED, SYS_clone, SYS_clone3, SYS_mount, SYS_mount_setattr, SYS_personality,
    SYS_socket, SYS_socketpair,
};
