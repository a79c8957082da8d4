package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
)

// Credential prefixes, so that secret scanners can recognise a leaked one.
const (
	ClientKeyPrefix = "parley_ck_"
	AgentKeyPrefix  = "parley_ak_"
	OperatorPrefix  = "parley_op_"
)

// A key is prefix + 16 hex digits of id + "_" + 43 base64url characters
// (256 random bits). The id lets the registry find the stored hash without
// comparing secrets in a lookup structure; the hash is then compared in
// constant time.
const (
	keyIDLen     = 16
	secretLen    = 43 // base64url of 32 bytes, unpadded
	keyLen       = len(ClientKeyPrefix) + keyIDLen + 1 + secretLen
	operatorLen  = len(OperatorPrefix) + secretLen
	MaxTokenSize = 256 // longest credential header value accepted
)

// NewKey returns a new key of kind (Client or Agent): its secret, its id
// and the SHA-256 of the secret, which is all a store may keep.
func NewKey(kind Kind) (secret, id string, hash [32]byte, err error) {
	prefix := AgentKeyPrefix
	if kind == Client {
		prefix = ClientKeyPrefix
	} else if kind != Agent {
		return "", "", hash, fmt.Errorf("keys are for clients and agents, not %v", kind)
	}
	var b [8 + 32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", hash, err
	}
	id = hex.EncodeToString(b[:8])
	secret = prefix + id + "_" + base64.RawURLEncoding.EncodeToString(b[8:])
	return secret, id, HashSecret(secret), nil
}

// NewOperatorToken returns a new random operator token.
func NewOperatorToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return OperatorPrefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// HashSecret is the SHA-256 of a secret. Keys carry 256 random bits, so a
// fast hash is enough: there is nothing to brute-force.
func HashSecret(secret string) [32]byte { return sha256.Sum256([]byte(secret)) }

// SameHash compares two hashes in constant time.
func SameHash(a, b [32]byte) bool { return subtle.ConstantTimeCompare(a[:], b[:]) == 1 }

// ParseKey splits a client or agent key into its kind and id; ok is false
// when secret does not have a key's shape. It does not say whether the key
// is live.
func ParseKey(secret string) (kind Kind, id string, ok bool) {
	if len(secret) != keyLen {
		return 0, "", false
	}
	switch {
	case strings.HasPrefix(secret, ClientKeyPrefix):
		kind = Client
	case strings.HasPrefix(secret, AgentKeyPrefix):
		kind = Agent
	default:
		return 0, "", false
	}
	rest := secret[len(ClientKeyPrefix):]
	id, tail := rest[:keyIDLen], rest[keyIDLen:]
	if _, err := hex.DecodeString(id); err != nil || strings.ToLower(id) != id || tail[0] != '_' {
		return 0, "", false
	}
	if _, err := base64.RawURLEncoding.DecodeString(tail[1:]); err != nil {
		return 0, "", false
	}
	return kind, id, true
}

// validOperatorToken reports whether t has the operator token's shape.
func validOperatorToken(t string) bool {
	if len(t) != operatorLen || !strings.HasPrefix(t, OperatorPrefix) {
		return false
	}
	_, err := base64.RawURLEncoding.DecodeString(t[len(OperatorPrefix):])
	return err == nil
}
