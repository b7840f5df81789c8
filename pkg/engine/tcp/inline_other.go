//go:build !linux

package tcp

// startInline: the inline accept path is Linux-only; elsewhere every
// connection gets its own handler.
func (s *Server) startInline() bool { return false }
