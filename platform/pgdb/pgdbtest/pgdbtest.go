// Package pgdbtest gives tests a real PostgreSQL: the server named by
// PARLEY_TEST_DATABASE_URL (.ci/run starts one and sets it), and a fresh
// schema per test, dropped when the test ends.
//
// Without the variable a test that needs PostgreSQL is skipped with a loud
// message, or fails when CI is set (to anything but "", "false" or "0"): CI
// must not pass without running the PostgreSQL suites.
package pgdbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvURL names the variable that points tests at a PostgreSQL server.
const EnvURL = "PARLEY_TEST_DATABASE_URL"

// URL returns the test server's URL, or skips (fails under CI) t.
func URL(t testing.TB) string {
	t.Helper()
	url := os.Getenv(EnvURL)
	if url != "" {
		return url
	}
	switch os.Getenv("CI") {
	case "", "false", "0":
		t.Skip("######## SKIPPED: PostgreSQL test. " + EnvURL + " is not set; .ci/run sets it (see docs/adr/0015-postgresql-backend.md to start a server) ########")
	default:
		t.Fatal(EnvURL + " is not set and CI is: the PostgreSQL suites must run in CI (.ci/run starts a server)")
	}
	return ""
}

// Schema returns the test server's URL and the name of a new, unused schema
// (which does not exist yet: the store creates it). The schema and all in
// it are dropped when t ends, after the cleanups registered later (so a
// store opened afterwards is closed first).
func Schema(t testing.TB) (url, schema string) {
	t.Helper()
	url = URL(t)
	var b [6]byte
	rand.Read(b[:]) // crypto/rand.Read never fails
	schema = "test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Errorf("pgdbtest: drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
			t.Errorf("pgdbtest: drop schema %s: %v", schema, err)
		}
	})
	return url, schema
}
