//go:build !amd64

package main

import "syscall"

const sysSetns = syscall.SYS_SETNS
