package telemetry

import (
	"context"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"
)

type routeKey struct{}

// SetRoute records the route pattern of the current request for metrics and
// logs. Handlers that are not on an http.ServeMux pattern (the gateway's
// inner mux) call it with their own pattern; it is a no-op outside
// Middleware.
func SetRoute(ctx context.Context, pattern string) {
	if p, ok := ctx.Value(routeKey{}).(*string); ok {
		*p = pattern
	}
}

// Middleware wraps an HTTP handler with the same concerns the gRPC
// interceptors apply: metrics by route pattern (never by raw path, which
// holds ids), logging and panic recovery.
func (m *Metrics) Middleware(logger *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		route := ""
		r = r.WithContext(context.WithValue(r.Context(), routeKey{}, &route))
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler { //nolint:errorlint // sentinel panic value, compared as net/http does
					panic(p)
				}
				m.panics.Inc()
				logger.ErrorContext(r.Context(), "panic in http handler", slog.String("path", r.URL.Path), slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
				if sw.code == 0 {
					http.Error(sw, `{"code":13,"message":"internal error"}`, http.StatusInternalServerError)
				}
			}
			code := sw.code
			if code == 0 {
				code = http.StatusOK
			}
			if route == "" {
				route = r.Pattern
			}
			if route == "" {
				route = "unmatched"
			}
			d := time.Since(start)
			m.httpSeconds.WithLabelValues(route, r.Method, strconv.Itoa(code)).Observe(d.Seconds())
			level := slog.LevelDebug
			if code >= 500 {
				level = slog.LevelWarn
			}
			if logger.Enabled(r.Context(), level) {
				logger.LogAttrs(r.Context(), level, "http request", slog.String("method", r.Method), slog.String("route", route), slog.Int("code", code), slog.String("duration", d.String()))
			}
		}()
		next.ServeHTTP(sw, r)
	})
}

// statusWriter remembers the status code. It forwards Flush so that
// server-sent events keep working through the middleware.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
