package telemetry

import (
	"context"
	"log/slog"
	"runtime/debug"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ServerOptions returns the interceptor chain for a gRPC server: metrics,
// then logging, then recovery (innermost, so a recovered panic is still
// logged and counted as Internal).
func ServerOptions(m *Metrics, logger *slog.Logger) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(UnaryInterceptors(m, logger)...),
		grpc.ChainStreamInterceptor(m.stream, logStream(logger), m.recoverStream(logger)),
	}
}

// UnaryInterceptors are ServerOptions' unary interceptors, in order, for
// a caller that runs handlers without a gRPC server (serve.InProcessConn).
func UnaryInterceptors(m *Metrics, logger *slog.Logger) []grpc.UnaryServerInterceptor {
	return []grpc.UnaryServerInterceptor{m.unary, logUnary(logger), m.recoverUnary(logger)}
}

func (m *Metrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := h(ctx, req)
	m.rpcSeconds.WithLabelValues(info.FullMethod, status.Code(err).String()).Observe(time.Since(start).Seconds())
	return resp, err
}

func (m *Metrics) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	start := time.Now()
	err := h(srv, ss)
	m.rpcSeconds.WithLabelValues(info.FullMethod, status.Code(err).String()).Observe(time.Since(start).Seconds())
	return err
}

func logUnary(logger *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := h(ctx, req)
		logCall(ctx, logger, info.FullMethod, status.Code(err), time.Since(start), err)
		return resp, err
	}
}

func logStream(logger *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		start := time.Now()
		err := h(srv, ss)
		logCall(ss.Context(), logger, info.FullMethod, status.Code(err), time.Since(start), err)
		return err
	}
}

// logCall logs successful calls at debug and failures at info (client
// errors) or warn (server errors), so production logs stay quiet.
func logCall(ctx context.Context, logger *slog.Logger, method string, code codes.Code, d time.Duration, err error) {
	level := slog.LevelDebug
	switch code {
	case codes.OK:
	case codes.Internal, codes.Unknown, codes.DataLoss, codes.Unavailable:
		level = slog.LevelWarn
	default:
		level = slog.LevelInfo
	}
	if !logger.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{slog.String("method", method), slog.String("code", code.String()), slog.String("duration", d.String())}
	if err != nil {
		attrs = append(attrs, slog.String("err", status.Convert(err).Message()))
	}
	logger.LogAttrs(ctx, level, "grpc call", attrs...)
}

func (m *Metrics) recoverUnary(logger *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				m.panics.Inc()
				logger.ErrorContext(ctx, "panic in grpc handler", slog.String("method", info.FullMethod), slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
				err = status.Error(codes.Internal, "internal error")
			}
		}()
		return h(ctx, req)
	}
}

func (m *Metrics) recoverStream(logger *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
		defer func() {
			if p := recover(); p != nil {
				m.panics.Inc()
				logger.ErrorContext(ss.Context(), "panic in grpc handler", slog.String("method", info.FullMethod), slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
				err = status.Error(codes.Internal, "internal error")
			}
		}()
		return h(srv, ss)
	}
}
