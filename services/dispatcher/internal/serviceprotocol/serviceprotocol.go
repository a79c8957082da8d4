// Package serviceprotocol holds the network's built-in service protocols,
// delegate, allocate and transact (socontra.md section 8), as protocol
// documents.
//
// Each is an ordinary PD: Markdown with a YAML metadata block whose
// stateMachine the registry parses and the dispatcher's protocolcontrol
// enforces per (dialogue, supplier), as it would any PD's. Nothing in the
// dispatcher knows their message types: a fourth service protocol needs only
// a new PD. The dispatcher stores these three in the registry when it starts
// (Register), so they are resolvable by hash like any other.
package serviceprotocol

import (
	"context"
	"crypto/sha1" //nolint:gosec // SHA-1 is the Agora protocol hash, not a security boundary here
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

//go:embed pd/*.md
var files embed.FS

// Names are the built-in service protocols' names, in a fixed order.
var Names = []string{"delegate", "allocate", "transact"}

// Protocol is one built-in PD.
type Protocol struct {
	Name    string // delegate, allocate or transact
	Content []byte // the exact bytes the hash covers
	Hash    string // SHA-1 of Content, 40 lowercase hex
}

// Builtins returns the built-in PDs in Names order.
func Builtins() []Protocol {
	out := make([]Protocol, 0, len(Names))
	for _, n := range Names {
		p, _ := ByName(n)
		out = append(out, p)
	}
	return out
}

// ByName returns the built-in PD called name.
func ByName(name string) (Protocol, bool) {
	b, err := files.ReadFile("pd/" + name + ".md")
	if err != nil {
		return Protocol{}, false
	}
	sum := sha1.Sum(b) //nolint:gosec // the Agora protocol hash
	return Protocol{Name: name, Content: b, Hash: hex.EncodeToString(sum[:])}, true
}

// ByHash returns the built-in PD with that SHA-1 (40 lowercase hex).
// Anything else is answered before the built-ins are read and hashed:
// most messages name no protocol, and each asks.
func ByHash(hash string) (Protocol, bool) {
	if len(hash) != sha1.Size*2 || strings.Trim(hash, "0123456789abcdef") != "" {
		return Protocol{}, false
	}
	for _, p := range Builtins() {
		if p.Hash == hash {
			return p, true
		}
	}
	return Protocol{}, false
}

// Registrar stores a PD in the registry. Storing the same bytes twice must
// succeed (the registry returns the stored record).
type Registrar interface {
	RegisterProtocol(ctx context.Context, content []byte) error
}

// Register stores every built-in PD through r, and returns the errors of
// those it could not store. It is idempotent; callers retry it until it
// succeeds.
func Register(ctx context.Context, r Registrar) error {
	var errs []error
	for _, p := range Builtins() {
		if err := r.RegisterProtocol(ctx, p.Content); err != nil {
			errs = append(errs, fmt.Errorf("protocol %s (%s): %w", p.Name, p.Hash, err))
		}
	}
	return errors.Join(errs...)
}
