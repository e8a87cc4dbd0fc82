package mirrorcache

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/zap/zapcore"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// The cache logs as the rest of the binary (zap through logr) at the configuration's log.level
// and log.formatter, which the --zap flags override.
func TestLoggerFromConfiguration(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cfg        mirror.CacheSettings
		flags      zap.Options
		info, json bool
	}{
		{"as rendered", mirror.CacheSettings{LogLevel: "info", LogFormat: "json"}, zap.Options{}, true, true},
		{"error only", mirror.CacheSettings{LogLevel: "error", LogFormat: "json"}, zap.Options{}, false, true},
		{"text", mirror.CacheSettings{LogLevel: "info", LogFormat: "text"}, zap.Options{}, true, false},
		{"a flag's level wins", mirror.CacheSettings{LogLevel: "error", LogFormat: "json"}, zap.Options{Level: zapcore.InfoLevel}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			flags := tc.flags
			flags.DestWriter = &out
			log, err := newLogger(tc.cfg, &flags)
			if err != nil {
				t.Fatal(err)
			}
			log.Info("an info line")
			log.Error(nil, "an error line")
			got := out.String()
			if strings.Contains(got, "an info line") != tc.info || !strings.Contains(got, "an error line") {
				t.Errorf("info written %v, want %v; error written: %q", strings.Contains(got, "an info line"), tc.info, got)
			}
			if strings.HasPrefix(got, "{") != tc.json {
				t.Errorf("JSON %v, want %v: %q", strings.HasPrefix(got, "{"), tc.json, got)
			}
		})
	}
}
