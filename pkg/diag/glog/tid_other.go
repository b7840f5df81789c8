//go:build !linux

package glog

import "os"

func threadID() int { return os.Getpid() }
