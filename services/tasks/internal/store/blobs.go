package store

import (
	"errors"
	"io"
)

// ErrTooLarge reports artifact content over the size limit.
var ErrTooLarge = errors.New("artifact too large")

// Blobs keeps artifact bytes, by task id and artifact id (both made by the
// server). The bbolt deployment keeps them as files (package artifactfs),
// the PostgreSQL one in the database (pgstore.Blobs), so that replicas need
// no shared volume. Every backend passes storetest.RunBlobs.
//
// The artifact's file name and relative path are metadata: the server
// checks them (artifactfs.CleanFileName, CleanRelativePath) before bytes
// are written, whatever the backend, and they play no part here.
type Blobs interface {
	// Write stores r's bytes, at most limit of them (else an error matching
	// ErrTooLarge, and nothing is stored), durably before it returns, and
	// returns their size.
	Write(taskID, artifactID string, r io.Reader, limit int64) (int64, error)
	// Open opens stored bytes for reading; unknown ones are an error
	// matching fs.ErrNotExist. The caller closes the reader.
	Open(taskID, artifactID string) (io.ReadSeekCloser, error)
}
