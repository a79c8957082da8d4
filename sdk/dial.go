package sdk

import "google.golang.org/grpc"

// The flow-control windows of DialOptions: what a stream, and the
// connection's streams together, may be sent before the client
// acknowledges. The same as the server's and Parley's own clients'
// (platform/grpcclient.StreamWindow and ConnWindow), copied because the
// SDK imports no platform package; e2e/flowcontrol_test.go checks that
// they agree.
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
// the server system calls and thread switches. The price: a stream
// receives at most 1 MiB per round trip (about 10 MiB/s at 100 ms), where
// dynamic windows could grow to 16 MiB.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithStaticStreamWindowSize(streamWindow),
		grpc.WithStaticConnWindowSize(connWindow),
	}
}
