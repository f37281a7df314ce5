package main

// setns(2) on amd64: Go's syscall package, frozen before it was added there, has no SYS_SETNS.
const sysSetns = 308
