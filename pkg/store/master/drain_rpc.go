package master

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvcache-ops/mc/pkg/store"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// maxDrainWait bounds a node's long poll for drain tasks.
const maxDrainWait = 30 * time.Second

type drainServer struct {
	pb.UnimplementedDrainServer
	m *Master
}

func (s *drainServer) Tasks(ctx context.Context, r *pb.DrainTasksRequest) (*pb.DrainTasksResponse, error) {
	client := store.UUIDFromPB(r.ClientId)
	if client.IsZero() {
		return nil, status.Error(codes.InvalidArgument, "drain tasks: no client id")
	}
	results := make([]DrainResult, len(r.Results))
	for i, x := range r.Results {
		results[i].ID = x.Id
		if x.Code != 0 {
			results[i].Err = store.Errorf(store.Code(x.Code), "%s", x.Message)
		}
	}
	wait := min(time.Duration(r.WaitMs)*time.Millisecond, maxDrainWait)
	tasks := s.m.DrainTasks(ctx, client, results, int(min(r.MaxTasks, 4096)), wait)
	out := &pb.DrainTasksResponse{Tasks: make([]*pb.DrainTask, len(tasks))}
	for i, t := range tasks {
		dst := &pb.Replica{}
		store.FillReplicaPB(dst, t.Dst)
		out.Tasks[i] = &pb.DrainTask{Id: t.ID, Key: t.Key, SrcAddr: t.SrcAddr, Size: t.Size, Dst: dst}
	}
	return out, nil
}
