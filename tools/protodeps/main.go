// Command protodeps writes the third-party .proto files that Parley's protos
// import (google/api annotations, http rules, field behaviour and resource
// descriptors) into a directory, usually third_party/proto.
//
// The files are printed from the Go descriptors compiled into the pinned
// google.golang.org/genproto/googleapis/api module, so no network access or
// hand-copied proto sources are needed. The output is deterministic.
//
// Usage:
//
//	protodeps DIR
package main

import (
	"fmt"
	"os"

	"github.com/jhump/protoreflect/v2/protoprint"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/protobuf/reflect/protoreflect"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "protodeps:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: protodeps DIR")
	}
	files := []protoreflect.FileDescriptor{
		annotations.File_google_api_annotations_proto,
		annotations.File_google_api_http_proto,
		annotations.File_google_api_field_behavior_proto,
		annotations.File_google_api_resource_proto,
	}
	p := &protoprint.Printer{}
	if err := os.MkdirAll(args[0], 0o755); err != nil {
		return err
	}
	return p.PrintProtosToFileSystem(files, args[0])
}
