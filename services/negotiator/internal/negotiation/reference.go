package negotiation

import (
	"strings"
)

// ReferenceHash is the protocolHash value with which the reference Python
// library opens a negotiation (specs/agora.md section 10).
const ReferenceHash = "negotiation"

// ExtractFinalProtocol finds the reference library's final PD: the text
// between the first <FINALPROTOCOL> and the following </FINALPROTOCOL>,
// trimmed as the library trims it before hashing. ok is false when there is
// no complete tag pair or the PD is empty.
func ExtractFinalProtocol(text string) (pd string, ok bool) {
	const open, closing = "<FINALPROTOCOL>", "</FINALPROTOCOL>"
	_, rest, found := strings.Cut(text, open)
	if !found {
		return "", false
	}
	pd, _, found = strings.Cut(rest, closing)
	if !found {
		return "", false
	}
	pd = strings.TrimSpace(pd)
	return pd, pd != ""
}
