package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/fieldmaskpb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/envflag"
	"github.com/parleyhq/parley/sdk"
)

// An owner's approval key pair: the private key in a PEM file (PKCS #8,
// mode 0600) that only the owner's machine holds, the public key (32 bytes,
// standard base64) in the registry as the agent's
// owner.approval_public_key. `parley approve` signs with the file; the
// dispatcher verifies with the registry's copy.

// runKeygen is `parley keygen FILE`.
func runKeygen(e env, args []string) error {
	fs := flag.NewFlagSet("parley keygen", flag.ContinueOnError)
	pos, err := parseArgs(e, fs, args, envflag.Doc{
		Usage: "parley keygen FILE [flags]",
		Summary: "Make an owner's Ed25519 approval key pair: the private key goes to FILE (PEM, mode 0600;\n" +
			"it must not exist yet), the public key to FILE.pub and, alone, to stdout (standard base64).\n" +
			"Register the public key with 'parley agent owner CLIENT:AGENT --approval-key FILE.pub'.",
		Args:     []envflag.Arg{{Name: "FILE", Help: "where to write the private key"}},
		Examples: []string{"parley keygen owner.key"},
	})
	if err != nil {
		return err
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(pos[0], os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := errors.Join(pem.Encode(f, &pem.Block{Type: "PRIVATE KEY", Bytes: der}), f.Close()); err != nil {
		return err
	}
	b64 := base64.StdEncoding.EncodeToString(pub)
	if err := os.WriteFile(pos[0]+".pub", []byte(b64+"\n"), 0o644); err != nil { //nolint:gosec // a public key
		return err
	}
	fmt.Fprintf(e.stderr, "wrote the private key to %s and the public key to %s.pub\n", pos[0], pos[0])
	fmt.Fprintln(e.stdout, b64)
	return nil
}

// readApprovalKey reads a private key file written by parley keygen.
func readApprovalKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path) //nolint:gosec // the user names the file
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s holds no PEM private key (make one with parley keygen)", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s holds a private key that is not Ed25519", path)
	}
	return priv, nil
}

// readPublicKey reads an approval public key: a .pub file of parley keygen
// or the base64 itself.
func readPublicKey(arg string) ([]byte, error) {
	text := arg
	if b, err := os.ReadFile(arg); err == nil { //nolint:gosec // the user names the file
		text = string(b)
	}
	k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(text))
	if err != nil || len(k) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("--approval-key %q is neither a .pub file of parley keygen nor a base64 Ed25519 public key", arg)
	}
	return k, nil
}

var currencyFlag = regexp.MustCompile(`^[A-Z]{3}$`)

// runApprove is `parley approve`: sign an approval, print it as JSON.
func runApprove(e env, args []string) error {
	fs := flag.NewFlagSet("parley approve", flag.ContinueOnError)
	keyFile := fs.String("key", "", "the owner's private key file (parley keygen)")
	order := fs.String("order", "", "the order id; or give --dialogue and the order id is computed from it and --payee")
	dialogue := fs.String("dialogue", "", "the dialogue id, when --order is not given")
	amount := fs.Int64("amount-micros", 0, "the amount in millionths of the currency's unit, as the offer's price states it")
	currency := fs.String("currency", "USD", "ISO 4217 code of the offer's price")
	payee := fs.String("payee", "", "the supplier paid, CLIENT:AGENT or clients/CLIENT/agents/AGENT")
	expires := fs.Duration("expires", 10*time.Minute, "how long the approval stays valid")
	if _, err := parseArgs(e, fs, args, envflag.Doc{
		Usage: "parley approve [flags]",
		Summary: "Sign an owner's approval of one acceptance with the key from parley keygen (--key, with\n" +
			"--order or --dialogue, --payee and --amount-micros), and print it as\n" +
			"JSON: the value of accept_offer's human_authorization field. The dispatcher checks it with\n" +
			"the agent's owner.approval_public_key over the order id, amount, currency, payee and expiry.",
		Examples: []string{"parley approve --key owner.key --dialogue $DIALOGUE --payee acme:shop --amount-micros 2500000"},
		Env:      map[string]string{"key": "PARLEY_APPROVAL_KEY"},
	}); err != nil {
		return err
	}
	var problems []string
	if *keyFile == "" {
		problems = append(problems, "--key is required")
	}
	if (*order == "") == (*dialogue == "") {
		problems = append(problems, "give exactly one of --order and --dialogue")
	}
	if *amount <= 0 {
		problems = append(problems, "--amount-micros must be above 0")
	}
	if !currencyFlag.MatchString(*currency) {
		problems = append(problems, "--currency must be three uppercase letters")
	}
	if *expires <= 0 {
		problems = append(problems, "--expires must be above 0")
	}
	name, err := agentName(*payee)
	if err != nil {
		problems = append(problems, "--payee: "+err.Error())
	}
	if len(problems) > 0 {
		return usageErrorf("%s", strings.Join(problems, "; "))
	}
	key, err := readApprovalKey(*keyFile)
	if err != nil {
		return err
	}
	if *order == "" {
		*order = sdk.OrderID(*dialogue, name)
	}
	a := sdk.SignApproval(key, sdk.ApprovalTerms{Order: *order, AmountMicros: *amount, Currency: *currency, Payee: name}, time.Now().Add(*expires))
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	return writeIndented(e.stdout, b)
}

// agentOwner is `parley agent owner CLIENT:AGENT`: change some of the
// owner's details, keeping the others.
func agentOwner(e env, args []string) error {
	fs := flag.NewFlagSet("parley agent owner", flag.ContinueOnError)
	key := fs.String("approval-key", "", "the owner's approval public key: a .pub file of parley keygen, or its base64")
	perTx := fs.Int64("automated-limit-per-transaction", 0, "micro-USD; above it an acceptance needs the owner's approval (0: always)")
	perDay := fs.Int64("automated-limit-per-day", 0, "micro-USD; once a UTC day's acceptances pass it, each needs the owner's approval (0: always)")
	txLimit := fs.Int64("transaction-limit", 0, "micro-USD; no acceptance may pass it, approved or not (0: no limit)")
	dayLimit := fs.Int64("daily-limit", 0, "micro-USD; a UTC day's acceptances may not pass it, approved or not (0: no limit)")
	return agentCall(e, fs, args, clientDoc("parley agent owner CLIENT:AGENT [flags]",
		"Change the approval key and spending limits of a hosted agent's owner (those whose flags are\ngiven; the rest are kept); prints the agent as JSON. Needs the client's key or the operator token.",
		[]envflag.Arg{argAgent},
		"parley agent owner acme:buyer --approval-key owner.key.pub --automated-limit-per-transaction 1000000"), func(c registryv1.RegistryServiceClient, name string, _ []string) error {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if len(set) == 0 {
			return errors.New("give at least one of --approval-key, --automated-limit-per-transaction, --automated-limit-per-day, --transaction-limit, --daily-limit")
		}
		ctx, cancel := callContext()
		defer cancel()
		a, err := c.GetAgent(ctx, &registryv1.GetAgentRequest{Name: name})
		if err != nil {
			return err
		}
		ow := a.GetOwner()
		if ow == nil {
			ow = &registryv1.Owner{}
		}
		if set["approval-key"] {
			if ow.ApprovalPublicKey, err = readPublicKey(*key); err != nil {
				return err
			}
		}
		if set["automated-limit-per-transaction"] {
			ow.AutomatedLimitPerTransactionMicroUsd = perTx
		}
		if set["automated-limit-per-day"] {
			ow.AutomatedLimitPerDayMicroUsd = perDay
		}
		if set["transaction-limit"] {
			ow.TransactionLimitMicroUsd = *txLimit
		}
		if set["daily-limit"] {
			ow.DailyLimitMicroUsd = *dayLimit
		}
		up, err := c.UpdateAgent(ctx, &registryv1.UpdateAgentRequest{
			Agent:      &registryv1.Agent{Name: name, Owner: ow, Etag: a.GetEtag()},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"owner"}},
		})
		if err != nil {
			return err
		}
		return printAgent(e, up)
	})
}
