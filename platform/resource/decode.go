package resource

import (
	"fmt"

	"google.golang.org/protobuf/proto"
)

// Decode unmarshals data, a stored resource, into m and returns m. The
// error names m's type, so that a corrupt record says what it held. Every
// store (bbolt or PostgreSQL) decodes its records with it.
func Decode[T proto.Message](data []byte, m T) (T, error) {
	if err := proto.Unmarshal(data, m); err != nil {
		return m, fmt.Errorf("decode %T: %w", m, err)
	}
	return m, nil
}
