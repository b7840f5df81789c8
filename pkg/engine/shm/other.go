//go:build !linux

package shm

// Region, Peer and Mapping exist elsewhere so that the engine builds;
// nothing can create them.

type Region struct{}

func NewRegion(size int, t Token, id uint64) (*Region, error) { return nil, ErrUnsupported }
func (r *Region) Bytes() []byte                               { return nil }
func (r *Region) FD() int                                     { return -1 }
func (r *Region) ID() uint64                                  { return 0 }
func (r *Region) Retire()                                     {}
func (r *Region) Revive()                                     {}
func (r *Region) Live() bool                                  { return false }
func (r *Region) Close() error                                { return nil }

type Local struct {
	ProcFS string
	BootID string
	UID    int
}

type Peer struct{}

type Mapping struct{}

func Attach(local Local, peer Identity) (*Peer, error) { return nil, ErrUnsupported }
func (p *Peer) Map(b BufferRef) (*Mapping, error)      { return nil, ErrUnsupported }
func (p *Peer) Identity() Identity                     { return Identity{} }
func (p *Peer) Exited() bool                           { return true }
func (p *Peer) Close() error                           { return nil }
func (m *Mapping) Bytes() []byte                       { return nil }
func (m *Mapping) Ref() BufferRef                      { return BufferRef{} }
func (m *Mapping) Live() bool                          { return false }
func (m *Mapping) Close() error                        { return nil }
