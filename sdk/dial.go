package sdk

import "google.golang.org/grpc"

// The flow-control windows of DialOptions: what the connection's streams
// may be sent before the client acknowledges it, each and together. They
// match the server's (platform/serve).
const (
	streamWindow = 1 << 20
	connWindow   = 4 << 20
)

// DialOptions are the options Parley recommends for an agent's connection,
// to add to the transport credentials:
//
//	conn, err := grpc.NewClient(addr, append(sdk.DialOptions(), grpc.WithTransportCredentials(creds))...)
//
// They fix the connection's flow-control windows (1 MiB a stream, 4 MiB the
// connection). With gRPC's default dynamic windows the client sends a PING
// after each message it receives while none is out, to estimate the
// bandwidth-delay product: at a message at a time, a PING and its
// acknowledgement per message received, which costs both the agent and
// the server system calls and thread switches.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithStaticStreamWindowSize(streamWindow),
		grpc.WithStaticConnWindowSize(connWindow),
	}
}
