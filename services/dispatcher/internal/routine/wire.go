package routine

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The pool and its workers talk over the worker's stdin and stdout in
// frames: a little-endian uint32 length, a type byte, then fields, each a
// uint32 length and its bytes.
//
//	parent → worker                      worker → parent
//	P key name src limits tools…         H (hello, once at start)
//	C key fn deadline hasMem mem args…   K callables functions (compiled)
//	R ok payload (a tool's answer)       T tool arg (a tool call)
//	                                     D out hasMem mem (the result)
//	                                     E kind message (a failure)
//	                                     U (C of a program it does not hold)
const (
	frameHello    = 'H'
	frameProgram  = 'P'
	frameCompiled = 'K'
	frameCall     = 'C'
	frameTool     = 'T'
	frameToolDone = 'R'
	frameDone     = 'D'
	frameError    = 'E'
	frameUnknown  = 'U'
)

// maxFrame bounds a frame: the largest is a program with its tables.
const maxFrame = 256 << 20

func writeFrame(w *bufio.Writer, typ byte, fields ...[]byte) error {
	n := 1
	for _, f := range fields {
		n += 4 + len(f)
	}
	if n > maxFrame {
		return fmt.Errorf("routine worker frame of %d bytes is over %d", n, maxFrame)
	}
	var hdr [5]byte
	binary.LittleEndian.PutUint32(hdr[:4], uint32(n))
	hdr[4] = typ
	_, _ = w.Write(hdr[:])
	for _, f := range fields {
		var l [4]byte
		binary.LittleEndian.PutUint32(l[:], uint32(len(f)))
		_, _ = w.Write(l[:])
		_, _ = w.Write(f)
	}
	return w.Flush()
}

var errBadFrame = errors.New("malformed routine worker frame")

func readFrame(r *bufio.Reader) (byte, [][]byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.LittleEndian.Uint32(hdr[:4]))
	if n < 1 || n > maxFrame {
		return 0, nil, errBadFrame
	}
	body := make([]byte, n-1)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	var fields [][]byte
	for len(body) > 0 {
		if len(body) < 4 {
			return 0, nil, errBadFrame
		}
		l := int(binary.LittleEndian.Uint32(body[:4]))
		body = body[4:]
		if l > len(body) {
			return 0, nil, errBadFrame
		}
		fields = append(fields, body[:l:l])
		body = body[l:]
	}
	return hdr[4], fields, nil
}

func putInt(v int64) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(v)) }

func getInt(b []byte) int64 {
	if len(b) != 8 {
		return 0
	}
	return int64(binary.LittleEndian.Uint64(b))
}

func putBool(v bool) []byte {
	if v {
		return []byte{1}
	}
	return []byte{0}
}
