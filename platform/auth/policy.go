package auth

import (
	"regexp"
	"slices"
	"strings"

	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Rule says who may make one call: the kinds of caller allowed, and the
// request field naming the resource a non-operator caller must own (see
// Principal.Owns). For RPCs the field is a dotted path in the request
// message; for gateway routes the same path is read from the path
// parameters, then from the query when the gateway fills the request
// from the query (never from a query the body supersedes), else from the
// body as the gateway decodes it; for hand-written routes it is a path
// value or a template of them ("clients/{client}/agents/{agent}").
type Rule struct {
	Allow    Kind
	Resource string
}

// Policy maps a full gRPC method ("/parley.registry.v1.RegistryService/
// GetAgent") or a hand-written HTTP route pattern ("GET /healthz") to its
// rule. A call with no entry is refused.
type Policy map[string]Rule

// gatewayRoute is the RPC a gateway route calls and the body field of its
// google.api.http rule ("" none, "*" the whole request).
type gatewayRoute struct {
	method string
	body   string
	// input is the request message type, to read a resource the body
	// carries; nil when not linked in (such resources read as "").
	input protoreflect.MessageType
}

// queryFills reports whether the gateway fills field of the request from
// the query string: never with body "*", and not for fields under the
// body field, which the body fills.
func (r gatewayRoute) queryFills(field string) bool {
	switch r.body {
	case "":
		return true
	case "*":
		return false
	}
	return field != r.body && !strings.HasPrefix(field, r.body+".")
}

// gatewayRoutes maps each gateway route, "VERB /v1/pattern" as written in
// the google.api.http option, to its full gRPC method and body field, over
// every service linked into the binary. The gateway middleware learns the
// route's pattern, not the method, so this is how it finds the rule.
func gatewayRoutes() map[string]gatewayRoute {
	out := map[string]gatewayRoute{}
	protoregistry.GlobalFiles.RangeFiles(func(f protoreflect.FileDescriptor) bool {
		svcs := f.Services()
		for i := range svcs.Len() {
			svc := svcs.Get(i)
			methods := svc.Methods()
			for j := range methods.Len() {
				m := methods.Get(j)
				rule, _ := proto.GetExtension(m.Options(), annotations.E_Http).(*annotations.HttpRule)
				if rule == nil {
					continue
				}
				full := "/" + string(svc.FullName()) + "/" + string(m.Name())
				input, _ := protoregistry.GlobalTypes.FindMessageByName(m.Input().FullName())
				for _, r := range append([]*annotations.HttpRule{rule}, rule.GetAdditionalBindings()...) {
					if verb, pattern := httpRule(r); pattern != "" {
						out[verb+" "+normalise(pattern)] = gatewayRoute{method: full, body: r.GetBody(), input: input}
					}
				}
			}
		}
		return true
	})
	return out
}

// bodyResource reads field from body as the gateway decodes it into the
// request: protojson into the body field ("*": the whole request),
// unknown fields discarded. A body that does not decode reads as "", which
// no caller but the operator owns, so a resource can never be read
// differently here than the handler will see it.
func (r gatewayRoute) bodyResource(body []byte, field string) string {
	if r.input == nil || r.body == "" || len(body) == 0 {
		return ""
	}
	msg := r.input.New()
	target := msg
	if r.body != "*" {
		fd := msg.Descriptor().Fields().ByName(protoreflect.Name(r.body))
		if fd == nil || fd.Message() == nil || fd.IsList() || fd.IsMap() {
			return ""
		}
		target = msg.Mutable(fd).Message()
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(body, target.Interface()); err != nil {
		return ""
	}
	return fieldValue(msg.Interface(), field)
}

func httpRule(r *annotations.HttpRule) (verb, pattern string) {
	switch p := r.GetPattern().(type) {
	case *annotations.HttpRule_Get:
		return "GET", p.Get
	case *annotations.HttpRule_Post:
		return "POST", p.Post
	case *annotations.HttpRule_Put:
		return "PUT", p.Put
	case *annotations.HttpRule_Patch:
		return "PATCH", p.Patch
	case *annotations.HttpRule_Delete:
		return "DELETE", p.Delete
	case *annotations.HttpRule_Custom:
		return strings.ToUpper(p.Custom.GetKind()), p.Custom.GetPath()
	}
	return "", ""
}

// bareVariable is a path variable without a pattern, "{name}".
var bareVariable = regexp.MustCompile(`\{([a-zA-Z0-9_.]+)\}`)

// normalise writes a route pattern as runtime.Pattern.String does:
// "{name}" becomes "{name=*}".
func normalise(pattern string) string { return bareVariable.ReplaceAllString(pattern, "{$1=*}") }

// Missing returns the names among calls (full gRPC methods or route
// patterns) that have no entry in p, sorted.
func (p Policy) Missing(calls []string) []string {
	var out []string
	for _, c := range calls {
		if _, ok := p[c]; !ok {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}
