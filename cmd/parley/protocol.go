package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

// runProtocol is `parley protocol`: the registry's protocol documents.
func runProtocol(e env, args []string) error {
	return subcommand(e, "protocol", args, map[string]command{
		"add":    {"store a protocol document FILE ('-' for stdin); prints its SHA-1 hex", protocolAdd},
		"get":    {"print the exact document of HASH (hex or base64)", protocolGet},
		"list":   {"list stored protocols: SHA-1, size, name", protocolList},
		"search": {"list protocols whose name, description or tags contain TEXT", protocolSearch},
		"sync":   {"copy every protocol a configured peer registry holds (--peer)", protocolSync},
	})
}

func protocolAdd(e env, args []string) error {
	fs := flag.NewFlagSet("parley protocol add", flag.ContinueOnError)
	dial := dialServer(e, fs)
	args, err := parseArgs(fs, args, e.stderr, 1, "FILE")
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
	args, err := parseArgs(fs, args, e.stderr, 1, "HASH")
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
	nargs, usage := 0, ""
	if search {
		nargs, usage = 1, "TEXT"
	}
	args, err := parseArgs(fs, args, e.stderr, nargs, usage)
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
	if _, err := parseArgs(fs, args, e.stderr, 0, "[--peer ADDR]"); err != nil {
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
