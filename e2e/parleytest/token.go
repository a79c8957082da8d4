package parleytest

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// The operator token every server Start runs (--operator-token-file), made
// once per test binary, so that helpers can authenticate without knowing
// which server they call. RemoveBuilds deletes its file.
var operator struct {
	once        sync.Once
	dir         string
	file, token string
	err         error
}

func operatorToken(t testing.TB) (token, file string) {
	t.Helper()
	operator.once.Do(func() {
		var b [32]byte
		if _, operator.err = rand.Read(b[:]); operator.err != nil {
			return
		}
		if operator.dir, operator.err = os.MkdirTemp("", "parley-e2e-token"); operator.err != nil {
			return
		}
		operator.token = "parley_op_" + base64.RawURLEncoding.EncodeToString(b[:])
		operator.file = filepath.Join(operator.dir, "operator.token")
		operator.err = os.WriteFile(operator.file, []byte(operator.token+"\n"), 0o600)
	})
	if operator.err != nil {
		t.Fatal(operator.err)
	}
	return operator.token, operator.file
}

// OperatorToken is the operator token of every server Start runs.
func OperatorToken(t testing.TB) string {
	tok, _ := operatorToken(t)
	return tok
}

// OperatorTokenFile is the file holding OperatorToken, for servers started
// without Start (--operator-token-file).
func OperatorTokenFile(t testing.TB) string {
	_, file := operatorToken(t)
	return file
}

// Bearer is gRPC per-call credentials sending the operator token
// (grpc.WithPerRPCCredentials(parleytest.Bearer(t))).
func Bearer(t testing.TB) Credentials { return Credentials(OperatorToken(t)) }

// Credentials send a token as `authorization: Bearer <token>`; they
// implement grpc's credentials.PerRPCCredentials.
type Credentials string

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (c Credentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(c)}, nil
}

// RequireTransportSecurity is false: tests talk over loopback.
func (Credentials) RequireTransportSecurity() bool { return false }
