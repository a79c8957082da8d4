package storetest

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"strings"
	"testing"

	"github.com/parleyhq/parley/services/tasks/internal/store"
)

// RunBlobs is the conformance suite of store.Blobs; open returns a fresh,
// empty Blobs.
func RunBlobs(t *testing.T, open func(t *testing.T) store.Blobs) {
	t.Run("RoundTripByID", func(t *testing.T) {
		b := open(t)
		// Same-named files are metadata only: each id keeps its own bytes,
		// including empty ones and ones spanning several chunks.
		want := map[string][]byte{"a1": []byte("first"), "a2": {}, "a3": bytes.Repeat([]byte("0123456789abcdef"), 70_000)}
		for id, content := range want {
			n, err := b.Write("task", id, bytes.NewReader(content), 2<<20)
			if err != nil || n != int64(len(content)) {
				t.Fatalf("Write(%q) = %d, %v; want %d, nil", id, n, err, len(content))
			}
		}
		for id, content := range want {
			r, err := b.Open("task", id)
			if err != nil {
				t.Fatalf("Open(%q): %v", id, err)
			}
			got, err := io.ReadAll(r)
			r.Close()
			if err != nil || !bytes.Equal(got, content) {
				t.Errorf("Open(%q) read %d bytes, %v; want %d", id, len(got), err, len(content))
			}
		}
		if _, err := b.Open("task", "missing"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Open(missing) = %v, want fs.ErrNotExist", err)
		}
		if _, err := b.Open("other", "a1"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Open(another task's id) = %v, want fs.ErrNotExist", err)
		}
	})
	t.Run("SizeCap", func(t *testing.T) {
		b := open(t)
		if _, err := b.Write("task", "big", bytes.NewReader(make([]byte, 11)), 10); !errors.Is(err, store.ErrTooLarge) {
			t.Fatalf("Write(11 bytes, limit 10) = %v, want ErrTooLarge", err)
		}
		if _, err := b.Open("task", "big"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Open(refused upload) = %v, want fs.ErrNotExist: nothing stored", err)
		}
		if n, err := b.Write("task", "exact", bytes.NewReader(make([]byte, 10)), 10); err != nil || n != 10 {
			t.Errorf("Write(10 bytes, limit 10) = %d, %v; want 10, nil", n, err)
		}
	})
	t.Run("SeekAndRead", func(t *testing.T) {
		b := open(t)
		content := strings.Repeat("abcdefghij", 60_000) // 600 kB: several chunks
		if _, err := b.Write("task", "s", strings.NewReader(content), 1<<20); err != nil {
			t.Fatal(err)
		}
		r, err := b.Open("task", "s")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		end, err := r.Seek(0, io.SeekEnd)
		if err != nil || end != int64(len(content)) {
			t.Fatalf("Seek(end) = %d, %v; want %d", end, err, len(content))
		}
		for _, off := range []int64{0, 5, 262_143, 262_144, 300_001, end - 3} {
			if _, err := r.Seek(off, io.SeekStart); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 3)
			if _, err := io.ReadFull(r, buf); err != nil || string(buf) != content[off:off+3] {
				t.Errorf("read at %d = %q, %v; want %q", off, buf, err, content[off:off+3])
			}
		}
		if _, err := r.Seek(0, io.SeekEnd); err != nil {
			t.Fatal(err)
		}
		if n, err := r.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
			t.Errorf("Read at the end = %d, %v; want 0, EOF", n, err)
		}
	})
}
