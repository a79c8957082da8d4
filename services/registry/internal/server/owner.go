package server

import (
	"crypto/ed25519"
	"fmt"
	"regexp"
	"unicode/utf8"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
)

const maxOwnerText = 200

var countryPattern = regexp.MustCompile(`^[A-Z]{2}$`)

// checkOwner validates an agent's owner details; nil is valid.
func checkOwner(v *grpcerr.Violations, o *registryv1.Owner) {
	if o == nil {
		return
	}
	for _, f := range []struct{ field, val string }{{"name", o.GetName()}, {"company", o.GetCompany()}, {"contact", o.GetContact()}} {
		if n := utf8.RuneCountInString(f.val); n > maxOwnerText {
			v.Add("agent.owner."+f.field, fmt.Sprintf("has %d characters, at most %d allowed", n, maxOwnerText))
		}
	}
	if c := o.GetCountry(); c != "" && !countryPattern.MatchString(c) {
		v.Add("agent.owner.country", fmt.Sprintf("%q must be an ISO 3166-1 alpha-2 code, two uppercase letters", c))
	}
	if o.GetDailyLimitMicroUsd() < 0 {
		v.Add("agent.owner.daily_limit_micro_usd", "must not be negative")
	}
	if o.GetTransactionLimitMicroUsd() < 0 {
		v.Add("agent.owner.transaction_limit_micro_usd", "must not be negative")
	}
	if k := o.GetApprovalPublicKey(); len(k) != 0 && len(k) != ed25519.PublicKeySize {
		v.Add("agent.owner.approval_public_key", fmt.Sprintf("has %d bytes; an Ed25519 public key has %d", len(k), ed25519.PublicKeySize))
	}
	if o.GetAutomatedLimitPerTransactionMicroUsd() < 0 {
		v.Add("agent.owner.automated_limit_per_transaction_micro_usd", "must not be negative")
	}
	if o.GetAutomatedLimitPerDayMicroUsd() < 0 {
		v.Add("agent.owner.automated_limit_per_day_micro_usd", "must not be negative")
	}
}
