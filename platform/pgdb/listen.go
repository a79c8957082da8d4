package pgdb

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// Listen delivers the notifications of channels (NOTIFY, pg_notify) to fn
// until ctx ends, on a connection of its own (not one of the pool's). When
// the connection breaks it connects again, waiting from 100ms up to 5s
// between attempts, and logs each failure on logger.
//
// Notifications sent while no connection listened are lost, so after every
// LISTEN that succeeds (the first included) fn is called once per channel
// with an empty payload, meaning "anything may have changed": a listener
// then re-reads what it watches. Channels are free text (quoted here), and
// fn runs on Listen's goroutine, so it must not block for long.
func (d *DB) Listen(ctx context.Context, channels []string, logger *slog.Logger, fn func(channel, payload string)) {
	cfg := d.pool.Config().ConnConfig.Copy()
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := listenOnce(ctx, cfg, channels, fn, func() { wait = 100 * time.Millisecond })
		if ctx.Err() != nil {
			return
		}
		logger.WarnContext(ctx, "database notifications lost; listening again", slog.Any("err", err), slog.Duration("in", wait))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// listenOnce listens on one connection until it fails or ctx ends.
func listenOnce(ctx context.Context, cfg *pgx.ConnConfig, channels []string, fn func(channel, payload string), listening func()) error {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx) //nolint:contextcheck // closes after ctx ended too
	}()
	for _, ch := range channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return err
		}
	}
	listening()
	for _, ch := range channels {
		fn(ch, "")
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		fn(n.Channel, n.Payload)
	}
}

// maxIdentifier is the longest identifier PostgreSQL keeps (NAMEDATALEN-1
// bytes): LISTEN cuts a longer channel name short, and pg_notify refuses
// it.
const maxIdentifier = 63

// Channel returns the notification channel named prefix + schema when it
// fits PostgreSQL's 63 bytes. Otherwise the schema's tail gives way to a
// hash of the whole schema: prefix + the schema's start + "_" + 16 hex
// digits of its SHA-256, 63 bytes, still one name per schema (schemas are
// up to 63 bytes, channels share their prefix).
func Channel(prefix, schema string) string {
	name := prefix + schema
	if len(name) <= maxIdentifier {
		return name
	}
	sum := sha256.Sum256([]byte(schema))
	tag := "_" + hex.EncodeToString(sum[:8])
	keep := max(0, maxIdentifier-len(prefix)-len(tag))
	return prefix + schema[:min(keep, len(schema))] + tag
}
