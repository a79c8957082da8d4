package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/envflag"
)

// runProtocol is `parley protocol`: the registry's protocol documents.
func runProtocol(e env, args []string) error {
	return subcommand(e, "protocol", args, protocolCommands())
}

func protocolCommands() map[string]command {
	return map[string]command{
		"add":    {"store a protocol document FILE ('-' for stdin); prints its SHA-1 hex", protocolAdd},
		"get":    {"print the exact document of HASH (hex or base64)", protocolGet},
		"list":   {"list stored protocols: SHA-1, size, name", protocolList},
		"search": {"list protocols whose name, description or tags contain TEXT", protocolSearch},
		"sync":   {"copy every protocol a configured peer registry holds (--peer)", protocolSync},
	}
}

func protocolAdd(e env, args []string) error {
	fs := flag.NewFlagSet("parley protocol add", flag.ContinueOnError)
	dial := dialServer(e, fs)
	args, err := parseArgs(e, fs, args, clientDoc("parley protocol add FILE [flags]",
		"Store a protocol document in the registry; prints its SHA-1 in hex.",
		[]envflag.Arg{{Name: "FILE", Help: "the document (Markdown with front matter), or - for standard input"}},
		"parley protocol add weather.md"))
	if err != nil {
		return err
	}
	var content []byte
	if args[0] == "-" {
		content, err = io.ReadAll(os.Stdin)
	} else {
		content, err = os.ReadFile(args[0])
	}
	if err != nil {
		return err
	}
	conn, err := dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := callContext()
	defer cancel()
	p, err := registryv1.NewRegistryServiceClient(conn).CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: content}})
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, p.GetSha1Hex())
	return nil
}

func protocolGet(e env, args []string) error {
	fs := flag.NewFlagSet("parley protocol get", flag.ContinueOnError)
	dial := dialServer(e, fs)
	args, err := parseArgs(e, fs, args, clientDoc("parley protocol get HASH [flags]",
		"Print a stored protocol document exactly as stored.",
		[]envflag.Arg{argHash},
		"parley protocol get 0f3c...e9 > weather.md"))
	if err != nil {
		return err
	}
	conn, err := dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := callContext()
	defer cancel()
	p, err := registryv1.NewRegistryServiceClient(conn).GetProtocol(ctx, &registryv1.GetProtocolRequest{Name: "protocols/" + strings.TrimPrefix(args[0], "protocols/")})
	if err != nil {
		return err
	}
	_, err = e.stdout.Write(p.GetContent()) // exactly the stored bytes, no newline added
	return err
}

func protocolList(e env, args []string) error {
	return listProtocols(e, "parley protocol list", args, false)
}

func protocolSearch(e env, args []string) error {
	return listProtocols(e, "parley protocol search", args, true)
}

func listProtocols(e env, name string, args []string, search bool) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	dial := dialServer(e, fs)
	doc := clientDoc("parley protocol list [flags]", "List stored protocols: SHA-1, size in bytes, title.", nil,
		"parley protocol list")
	if search {
		doc = clientDoc("parley protocol search TEXT [flags]", "List stored protocols whose title, description or tags contain the text.",
			[]envflag.Arg{{Name: "TEXT", Help: "the text to look for, case-insensitive"}},
			"parley protocol search weather")
	}
	args, err := parseArgs(e, fs, args, doc)
	if err != nil {
		return err
	}
	query := ""
	if search {
		query = args[0]
	}
	conn, err := dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	c := registryv1.NewRegistryServiceClient(conn)
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	token := ""
	for {
		ctx, cancel := callContext()
		var (
			protocols []*registryv1.Protocol
			next      string
		)
		if search {
			resp, err := c.SearchProtocols(ctx, &registryv1.SearchProtocolsRequest{Query: query, PageSize: 1000, PageToken: token})
			if err != nil {
				cancel()
				return err
			}
			protocols, next = resp.GetProtocols(), resp.GetNextPageToken()
		} else {
			resp, err := c.ListProtocols(ctx, &registryv1.ListProtocolsRequest{PageSize: 1000, PageToken: token})
			if err != nil {
				cancel()
				return err
			}
			protocols, next = resp.GetProtocols(), resp.GetNextPageToken()
		}
		cancel()
		for _, p := range protocols {
			fmt.Fprintf(tw, "%s\t%d\t%s\n", p.GetSha1Hex(), p.GetSizeBytes(), p.GetTitle())
		}
		if next == "" {
			return tw.Flush()
		}
		token = next
	}
}

func protocolSync(e env, args []string) error {
	fs := flag.NewFlagSet("parley protocol sync", flag.ContinueOnError)
	dial := dialServer(e, fs)
	peer := fs.String("peer", "", "the peer registry to copy from, as configured with --registry-peers; empty means all")
	if _, err := parseArgs(e, fs, args, clientDoc("parley protocol sync [flags]",
		"Copy every protocol that the configured peer registries hold into this one.", nil,
		"parley protocol sync --peer registry.example.com:9090")); err != nil {
		return err
	}
	conn, err := dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := callContext()
	defer cancel()
	resp, err := registryv1.NewRegistryServiceClient(conn).SyncProtocols(ctx, &registryv1.SyncProtocolsRequest{Peer: *peer})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "copied %d, already present %d, failed %d\n", resp.GetCopiedCount(), resp.GetPresentCount(), len(resp.GetFailures()))
	for _, f := range resp.GetFailures() {
		fmt.Fprintln(e.stderr, f)
	}
	return nil
}
