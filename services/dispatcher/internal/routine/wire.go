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
//	parent → worker                            worker → parent
//	P key name src limits tools…               H (hello, once at start)
//	C key fn deadline startBy hasMem mem args… K callables functions at (compiled)
//	R ok payload (a tool's answer)             T tool arg (a tool call)
//	                                           D out hasMem mem cpu at (the result)
//	                                           E kind message cpu at (a failure)
//	                                           U at (C of a program it does not hold)
//	                                           B at (C not started by startBy)
//
// The parent may write several P and C frames before the first is
// answered (pipelining, pool.go); the worker takes them in order, one at a
// time, and answers each in turn. deadline (the caller's, 0 for none) and
// startBy (the end of the call's wait budget) are Unix times in ns; at,
// the Unix time in ns at which the worker wrote the answer, is when it
// started the next frame if that was already waiting.
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
	frameBusy     = 'B'
)

// maxFrame bounds a frame from the pool to a worker: the largest is a
// program with its tables (each at most 1 MiB, checked by the server).
// Frames the other way are capped per exchange by what the run's limits
// allow (Pool.load, Pool.call): a worker is never trusted with the size of
// the server's buffers.
const maxFrame = 256 << 20

// frameSlack is what a worker's frame may carry on top of the payload its
// limits allow: field headers, tool and function names, and an error's
// text (the worker cuts it to maxErrorText).
const frameSlack = 64 << 10

// maxErrorText bounds the text of a worker's failure (frameError).
const maxErrorText = 16 << 10

// frameTooLargeError is a frame whose header announced more than the
// reader's cap; its body was not read.
type frameTooLargeError struct{ size, limit int }

func (e *frameTooLargeError) Error() string {
	return fmt.Sprintf("a frame of %d bytes, over the cap of %d", e.size, e.limit)
}

// writeFrame writes a frame and flushes it.
func writeFrame(w *bufio.Writer, typ byte, fields ...[]byte) error {
	if err := putFrame(w, typ, fields...); err != nil {
		return err
	}
	return w.Flush()
}

// putFrame writes a frame to w's buffer, without flushing it.
func putFrame(w *bufio.Writer, typ byte, fields ...[]byte) error {
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
	return nil
}

var errBadFrame = errors.New("malformed routine worker frame")

// readFrame reads one frame of at most limit bytes; a larger one fails
// with *frameTooLargeError before anything is allocated for it.
func readFrame(r *bufio.Reader, limit int) (byte, [][]byte, error) {
	return readFrameLimit(r, func() int { return limit })
}

// readFrameLimit is readFrame with the cap asked once the header is read.
func readFrameLimit(r *bufio.Reader, capOf func() int) (byte, [][]byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.LittleEndian.Uint32(hdr[:4]))
	if n < 1 {
		return 0, nil, errBadFrame
	}
	if limit := capOf(); n > limit {
		return 0, nil, &frameTooLargeError{size: n, limit: limit}
	}
	body := make([]byte, n-1)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	// Calls and answers have at most 8 fields but for their arguments:
	// one allocation where growing from nil took four.
	fields := make([][]byte, 0, 8)
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

// trueField and falseField are putBool's fields, shared: frames are only
// read.
var trueField, falseField = []byte{1}, []byte{0}

func putBool(v bool) []byte {
	if v {
		return trueField
	}
	return falseField
}
