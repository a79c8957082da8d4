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
	neturl "net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// name returns a fresh lower-case identifier.
func name() string {
	var b [6]byte
	rand.Read(b[:]) // crypto/rand.Read never fails
	return "test_" + hex.EncodeToString(b[:])
}

// admin runs sql on the test server, reporting failures on t.
func admin(t testing.TB, url, sql string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Errorf("pgdbtest: %s: %v", sql, err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Errorf("pgdbtest: %s: %v", sql, err)
	}
}

// Database creates a new, empty database on the test server and returns
// its URL, for a whole service (or several replicas of one) that uses
// the services' own schema names. It is dropped when t ends, after the
// cleanups registered later, connections or not.
func Database(t testing.TB) string {
	t.Helper()
	url := URL(t)
	db := name()
	u, err := neturl.Parse(url)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("pgdbtest: %s: want a postgres:// URL", EnvURL)
	}
	admin(t, url, `CREATE DATABASE `+db)
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() { admin(t, url, `DROP DATABASE IF EXISTS `+db+` WITH (FORCE)`) })
	u.Path = "/" + db
	return u.String()
}

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
		t.Skip("######## SKIPPED: PostgreSQL test. " + EnvURL + " is not set; .ci/run sets it (see docs/adr/0007-postgresql-backend.md to start a server) ########")
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
	return schemaNamed(t, name())
}

// LongSchema is Schema with a name of the most bytes PostgreSQL keeps, 63,
// for the names derived from it (notification channels).
func LongSchema(t testing.TB) (url, schema string) {
	t.Helper()
	n := name()
	return schemaNamed(t, n+strings.Repeat("x", 63-len(n)))
}

func schemaNamed(t testing.TB, schema string) (string, string) {
	t.Helper()
	url := URL(t)
	t.Cleanup(func() { admin(t, url, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
	return url, schema
}

// Exec runs sql on the test server as its administrator (the user of
// PARLEY_TEST_DATABASE_URL), failing t on an error: tests that break
// things on purpose, as pg_terminate_backend or ALTER ROLE … NOLOGIN.
func Exec(t testing.TB, sql string) {
	t.Helper()
	admin(t, URL(t), sql)
	if t.Failed() {
		t.FailNow()
	}
}

// Int returns the one integer sql selects on the test server, run as its
// administrator.
func Int(t testing.TB, sql string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, URL(t))
	if err != nil {
		t.Fatalf("pgdbtest: %s: %v", sql, err)
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatalf("pgdbtest: %s: %v", sql, err)
	}
	return n
}

// Role creates a new superuser role on the test server, with the password
// of PARLEY_TEST_DATABASE_URL if it has one, and returns its name and dbURL
// with the role as the user: one process of a test connects as the role,
// so that the test can single out its sessions (pg_stat_activity.usename)
// or refuse its connections (ALTER ROLE … NOLOGIN) and no other's. The
// role is dropped when t ends, after the cleanups registered later (the
// processes using it): it must own nothing then, so let another user
// create the schema its sessions use.
func Role(t testing.TB, dbURL string) (role, roleURL string) {
	t.Helper()
	role = name()
	u, err := neturl.Parse(dbURL)
	if err != nil {
		t.Fatalf("pgdbtest: %v", err)
	}
	create := `CREATE ROLE ` + role + ` LOGIN SUPERUSER`
	if pw, ok := u.User.Password(); ok {
		create += ` PASSWORD '` + strings.ReplaceAll(pw, `'`, `''`) + `'`
		u.User = neturl.UserPassword(role, pw)
	} else {
		u.User = neturl.User(role)
	}
	Exec(t, create)
	t.Cleanup(func() { admin(t, URL(t), `DROP ROLE IF EXISTS `+role) })
	return role, u.String()
}
