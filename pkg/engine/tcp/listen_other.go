//go:build !linux

package tcp

func deferAccept(uintptr) {}
