package pgdb

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// ExclusiveOptions tune Exclusive.
type ExclusiveOptions struct {
	// Retry is how often a replica that does not hold the lock tries to
	// take it, and how often the holder checks that its connection (and so
	// its lock) is alive; 5s when 0.
	Retry time.Duration
	// Logger reports lost connections; discarded when nil.
	Logger *slog.Logger
}

// exclusiveSpace is the first key of Exclusive's advisory locks; the second
// is hashtext(name).
const exclusiveSpace = "parley.exclusive"

// Exclusive runs fn while this process holds the session advisory lock
// named name, so that of several replicas running Exclusive with one name,
// one runs fn at a time, until ctx ends. The lock lives on a connection of
// its own (not the pool's). PostgreSQL releases it when that session ends:
// when the holder stops, crashes or is killed (its socket closes), or when
// the server's TCP keepalives (set here to about 15s) find its host gone.
// Another replica then takes it within Retry.
//
// The holder pings its connection every Retry; when the ping fails it
// cancels fn's context, waits for fn to return and starts over. So two
// replicas may overlap for up to about Retry after the holder's connection
// broke: fn must be safe to run twice at once (its effects transactional),
// and Exclusive only avoids duplicate work and timers firing on several
// replicas, never guarding correctness alone. fn must return when its
// context ends.
//
// On a nil *DB (a service on bbolt: one process owns its file) Exclusive
// just runs fn(ctx).
func (d *DB) Exclusive(ctx context.Context, name string, opts ExclusiveOptions, fn func(ctx context.Context)) {
	if d == nil {
		fn(ctx)
		return
	}
	if opts.Retry <= 0 {
		opts.Retry = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	cfg := d.pool.Config().ConnConfig.Copy()
	// The server drops a silent client after about 5 + 2×5 s.
	cfg.RuntimeParams["tcp_keepalives_idle"] = "5"
	cfg.RuntimeParams["tcp_keepalives_interval"] = "5"
	cfg.RuntimeParams["tcp_keepalives_count"] = "2"
	for ctx.Err() == nil {
		if err := holdOnce(ctx, cfg, name, opts, fn); err != nil && ctx.Err() == nil {
			opts.Logger.WarnContext(ctx, "exclusive work: database connection lost; trying again", slog.String("work", name), slog.Any("err", err))
		}
		select {
		case <-ctx.Done():
		case <-time.After(opts.Retry):
		}
	}
}

// holdOnce connects, waits until it holds the lock, runs fn while the
// connection lives, and returns when ctx ends or the connection fails.
func holdOnce(ctx context.Context, cfg *pgx.ConnConfig, name string, opts ExclusiveOptions, fn func(context.Context)) error {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx) //nolint:contextcheck // closes after ctx ended too; closing ends the lock
	}()
	for {
		var held bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext($1), hashtext($2))`, exclusiveSpace, name).Scan(&held); err != nil {
			return err
		}
		if held {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(opts.Retry):
		}
	}
	work, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(work)
	}()
	defer func() { stop(); <-done }()
	t := time.NewTicker(opts.Retry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-done:
			return nil
		case <-t.C:
			pingCtx, cancel := context.WithTimeout(ctx, opts.Retry)
			err := conn.Ping(pingCtx)
			cancel()
			if err != nil {
				return err
			}
		}
	}
}

// Of returns the database of a store that has one (a pgstore's DB method),
// else nil: what a service's app passes around to run work once across
// replicas whatever its backend.
func Of(st any) *DB {
	if s, ok := st.(interface{ DB() *DB }); ok {
		return s.DB()
	}
	return nil
}

// ExclusiveHeld returns an SQL boolean expression: whether some session
// holds the Exclusive lock whose name the SQL text expression name gives.
// A pgstore uses it to tell the work of a live replica from a dead one's.
func ExclusiveHeld(name string) string {
	return `EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
AND classid = hashtext('` + exclusiveSpace + `')::oid AND objid = hashtext(` + name + `)::oid)`
}

// Every runs fn every interval until ctx ends, on one replica at a time
// (Exclusive, named name; on a nil *DB, in this process). The first run is
// one interval after the start.
func (d *DB) Every(ctx context.Context, name string, interval time.Duration, opts ExclusiveOptions, fn func(context.Context)) {
	d.Exclusive(ctx, name, opts, func(ctx context.Context) { Tick(ctx, interval, fn) })
}

// Tick runs fn every interval until ctx ends, in this process: periodic
// work that every replica does (Every, for work that one does).
func Tick(ctx context.Context, interval time.Duration, fn func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn(ctx)
		}
	}
}
