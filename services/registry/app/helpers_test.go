package app_test

import (
	"crypto/sha1" //nolint:gosec // the Agora id
)

func sha1Sum(s string) [20]byte { return sha1.Sum([]byte(s)) } //nolint:gosec // the Agora id
