package rest

import (
	"bytes"
	"context"
	"errors"
	"io"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
)

// ClientBackend is a Backend over the generated gRPC client, for `parley
// gateway`, where the tasks service runs in another process. Uploads and
// downloads are buffered in memory and bounded by the gRPC message size.
type ClientBackend struct {
	c tasksv1.TasksServiceClient
}

var _ Backend = ClientBackend{}

// NewClientBackend returns a Backend that calls c.
func NewClientBackend(c tasksv1.TasksServiceClient) ClientBackend { return ClientBackend{c: c} }

// CreateTask implements Backend.
func (b ClientBackend) CreateTask(ctx context.Context, req *tasksv1.CreateTaskRequest) (*tasksv1.Task, error) {
	return b.c.CreateTask(ctx, req)
}

// GetTask implements Backend.
func (b ClientBackend) GetTask(ctx context.Context, req *tasksv1.GetTaskRequest) (*tasksv1.Task, error) {
	return b.c.GetTask(ctx, req)
}

// ListTasks implements Backend.
func (b ClientBackend) ListTasks(ctx context.Context, req *tasksv1.ListTasksRequest) (*tasksv1.ListTasksResponse, error) {
	return b.c.ListTasks(ctx, req)
}

// CancelTask implements Backend.
func (b ClientBackend) CancelTask(ctx context.Context, req *tasksv1.CancelTaskRequest) (*tasksv1.Task, error) {
	return b.c.CancelTask(ctx, req)
}

// CreateStep implements Backend.
func (b ClientBackend) CreateStep(ctx context.Context, req *tasksv1.CreateStepRequest) (*tasksv1.Step, error) {
	return b.c.CreateStep(ctx, req)
}

// GetStep implements Backend.
func (b ClientBackend) GetStep(ctx context.Context, req *tasksv1.GetStepRequest) (*tasksv1.Step, error) {
	return b.c.GetStep(ctx, req)
}

// ListSteps implements Backend.
func (b ClientBackend) ListSteps(ctx context.Context, req *tasksv1.ListStepsRequest) (*tasksv1.ListStepsResponse, error) {
	return b.c.ListSteps(ctx, req)
}

// ListArtifacts implements Backend.
func (b ClientBackend) ListArtifacts(ctx context.Context, req *tasksv1.ListArtifactsRequest) (*tasksv1.ListArtifactsResponse, error) {
	return b.c.ListArtifacts(ctx, req)
}

// UploadArtifact implements Backend with CreateArtifact.
func (b ClientBackend) UploadArtifact(ctx context.Context, parent string, a *tasksv1.Artifact, r io.Reader) (*tasksv1.Artifact, error) {
	content, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	return b.c.CreateArtifact(ctx, &tasksv1.CreateArtifactRequest{Parent: parent, Artifact: a, Content: content})
}

type nopSeekCloser struct{ *bytes.Reader }

func (nopSeekCloser) Close() error { return nil }

// OpenArtifact implements Backend with GetArtifact and ReadArtifact.
func (b ClientBackend) OpenArtifact(ctx context.Context, name string) (*tasksv1.Artifact, io.ReadSeekCloser, error) {
	a, err := b.c.GetArtifact(ctx, &tasksv1.GetArtifactRequest{Name: name})
	if err != nil {
		return nil, nil, err
	}
	stream, err := b.c.ReadArtifact(ctx, &tasksv1.ReadArtifactRequest{Name: name})
	if err != nil {
		return nil, nil, err
	}
	var buf bytes.Buffer
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return a, nopSeekCloser{bytes.NewReader(buf.Bytes())}, nil
		}
		if err != nil {
			return nil, nil, err
		}
		buf.Write(chunk.GetData())
	}
}

// Subscribe implements Backend with WatchTask.
func (b ClientBackend) Subscribe(ctx context.Context, name string) (<-chan *tasksv1.Step, error) {
	stream, err := b.c.WatchTask(ctx, &tasksv1.WatchTaskRequest{Name: name})
	if err != nil {
		return nil, err
	}
	// Server-streaming calls report errors on Recv; check the task exists
	// first so unknown ids get 404 rather than an empty stream.
	if _, err := b.c.GetTask(ctx, &tasksv1.GetTaskRequest{Name: name}); err != nil {
		return nil, err
	}
	ch := make(chan *tasksv1.Step, subscriberBuffer)
	go func() {
		defer close(ch)
		for {
			msg, err := stream.Recv()
			if err != nil {
				return
			}
			select {
			case ch <- msg.GetStep():
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

const subscriberBuffer = 64
