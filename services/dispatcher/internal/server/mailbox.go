package server

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
)

// MailboxOptions tune the receive streams. Every field must be positive;
// the dispatcher's config owns the defaults (--mailbox-stream-*).
type MailboxOptions struct {
	// Batch is the most messages one stream response (or SSE flush)
	// carries.
	Batch int
	// Keepalive is how long a stream may stay silent before an empty batch
	// (an SSE comment) is sent.
	Keepalive time.Duration
	// MaxDuration ends a stream that has been open this long with
	// DEADLINE_EXCEEDED, so that clients reconnect (and re-authenticate).
	MaxDuration time.Duration
	// WriteTimeout bounds one SSE write: a client that stops reading is
	// cut off.
	WriteTimeout time.Duration
}

// NetworkMessage is d as its recipient receives it.
func NetworkMessage(d mailbox.Delivery) *dispatcherv1.NetworkMessage {
	m := d.Message
	return &dispatcherv1.NetworkMessage{
		MessageId:     m.ID,
		DialogueId:    m.DialogueID,
		Sender:        m.Sender,
		Recipient:     d.Agent,
		Category:      categories[string(m.Category)],
		MessageType:   m.Type,
		Protocol:      m.Protocol,
		RecipientType: m.RecipientType,
		BodyJson:      m.Body,
		InReplyTo:     m.InReplyTo,
		CreateTime:    timestamppb.New(m.Time),
		Cursor:        d.Cursor,
	}
}

func (s *Server) mailboxAgent(agent string) error {
	if s.opts.Delivery == nil {
		return status.Error(codes.Unimplemented, "this dispatcher has no mailboxes")
	}
	if !directory.ValidAgentName(agent) {
		return invalid("agent", "must be clients/{client}/agents/{agent}")
	}
	return nil
}

// receive runs one receive stream of agent, whichever the transport.
func (s *Server) receive(ctx context.Context, agent string, opts mailbox.ReceiveOptions, send func([]mailbox.Delivery) error) error {
	mo := s.opts.MailboxOptions
	ctx, cancel := context.WithTimeout(ctx, mo.MaxDuration)
	defer cancel()
	opts.Batch, opts.Keepalive, opts.Stop = mo.Batch, mo.Keepalive, s.opts.Stopping
	return s.opts.Delivery.Receive(ctx, agent, opts, send)
}

// ReceiveMessages implements dispatcherv1.DispatcherServiceServer.
func (s *Server) ReceiveMessages(req *dispatcherv1.ReceiveMessagesRequest, stream grpc.ServerStreamingServer[dispatcherv1.ReceiveMessagesResponse]) error {
	if err := s.mailboxAgent(req.GetAgent()); err != nil {
		return err
	}
	ctx := stream.Context()
	err := s.receive(ctx, req.GetAgent(), mailbox.ReceiveOptions{After: req.GetAfterCursor(), ClearBacklog: req.GetClearBacklog()},
		func(ds []mailbox.Delivery) error {
			resp := &dispatcherv1.ReceiveMessagesResponse{Messages: make([]*dispatcherv1.NetworkMessage, len(ds))}
			for i, d := range ds {
				resp.Messages[i] = NetworkMessage(d)
			}
			return stream.Send(resp)
		})
	return s.toStatus(ctx, err)
}

// AcknowledgeMessages implements dispatcherv1.DispatcherServiceServer.
func (s *Server) AcknowledgeMessages(ctx context.Context, req *dispatcherv1.AcknowledgeMessagesRequest) (*dispatcherv1.Mailbox, error) {
	if err := s.mailboxAgent(req.GetAgent()); err != nil {
		return nil, err
	}
	var (
		st  mailbox.State
		err error
	)
	if req.GetClearBacklog() {
		st, err = s.opts.Delivery.ClearBacklog(ctx, req.GetAgent())
	} else {
		st, err = s.opts.Delivery.Acknowledge(ctx, req.GetAgent(), req.GetCursor())
	}
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &dispatcherv1.Mailbox{
		Agent: req.GetAgent(), HeadCursor: st.Head, AcknowledgedCursor: st.Acked,
		PendingMessages: st.Pending, PendingBytes: st.PendingBytes,
	}, nil
}
