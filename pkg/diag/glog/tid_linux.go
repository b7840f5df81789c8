//go:build linux

package glog

import "syscall"

func threadID() int { return syscall.Gettid() }
