package meta

import (
	"encoding/json"
	"fmt"
)

// FileSegmentDesc is Mooncake's NVMe-oF file segment, stored at
// "mooncake/[<cluster>/]nvmeof/<segment>". mc reads these to report them;
// it does not transfer to files.
type FileSegmentDesc struct {
	Buffers []FileBufferDesc `json:"buffers"`
}

// FileBufferDesc is one file of a file segment. LocalPathMap says where
// each host sees the file ("host" -> local path).
type FileBufferDesc struct {
	Length       uint64            `json:"length"`
	FilePath     string            `json:"file_path"`
	LocalPathMap map[string]string `json:"local_path_map"`
}

// FileSegmentKey is where Mooncake stores a file segment.
func FileSegmentKey(clusterID, name string) string {
	return keyPrefix(clusterID) + "nvmeof/" + name
}

// DecodeFileSegment parses a file segment descriptor. A buffer needs a file
// path and a non-zero length; errors name the segment and the field.
func DecodeFileSegment(name string, b []byte) (*FileSegmentDesc, error) {
	var d FileSegmentDesc
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, &DescriptorError{Segment: name, Reason: "is not valid file segment JSON", Err: err}
	}
	for i, buf := range d.Buffers {
		f := fmt.Sprintf("buffers[%d]", i)
		if buf.FilePath == "" {
			return nil, &DescriptorError{Segment: name, Field: f + ".file_path", Reason: "is empty"}
		}
		if buf.Length == 0 {
			return nil, &DescriptorError{Segment: name, Field: f + ".length", Reason: "is 0"}
		}
	}
	return &d, nil
}

// EncodeFileSegment writes a file segment descriptor as Mooncake does.
func EncodeFileSegment(d *FileSegmentDesc) ([]byte, error) {
	out := *d
	if out.Buffers == nil {
		out.Buffers = []FileBufferDesc{}
	}
	for i := range out.Buffers {
		if out.Buffers[i].LocalPathMap == nil {
			out.Buffers[i].LocalPathMap = map[string]string{}
		}
	}
	return json.Marshal(out)
}
