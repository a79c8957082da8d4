// Package envflagtest holds test helpers for the rule that a service's
// config owns every default and its app copies Config into Options verbatim.
package envflagtest

import (
	"reflect"
	"testing"
)

// NonZeroLimits fails t for every integer or duration field of opts (a
// struct) that is zero. Run on the Options an app builds from its default
// config, it catches a limit added to Options without a flag: such a field
// stays zero.
func NonZeroLimits(t testing.TB, name string, opts any) {
	t.Helper()
	nonZero(t, name, reflect.ValueOf(opts), false)
}

// NonZeroLimitsNested is NonZeroLimits walking into nested structs too, for
// Options whose nested structs hold only limits.
func NonZeroLimitsNested(t testing.TB, name string, opts any) {
	t.Helper()
	nonZero(t, name, reflect.ValueOf(opts), true)
}

func nonZero(t testing.TB, path string, v reflect.Value, nested bool) {
	t.Helper()
	for i := range v.NumField() {
		f, name := v.Field(i), path+"."+v.Type().Field(i).Name
		switch f.Kind() {
		case reflect.Struct:
			if nested {
				nonZero(t, name, f, nested)
			}
		case reflect.Int, reflect.Int64, reflect.Uint64:
			if f.IsZero() {
				t.Errorf("%s is zero under the default config", name)
			}
		}
	}
}
