package namespaces

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	corev1 "k8s.io/api/core/v1"

	"github.com/quartermaster-dev/quartermaster/internal/cachemeta"
	"github.com/quartermaster-dev/quartermaster/internal/kubeconfig"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
)

// keySummary holds, in the cache's copy of a credentials Secret, the summary that replaces its data
// (a key no real Secret can have: data keys have no "/").
const keySummary = "quartermaster.dev/summary"

// credentials is what the drift check reads of a credentials Secret.
type credentials struct {
	HasToken      bool   `json:"token,omitempty"`
	HasKubeconfig bool   `json:"kubeconfig,omitempty"`
	CADigest      string `json:"ca"` // SHA-256, hex
	// NamespaceIsName: the namespace the credentials are for is the one the Secret is named after
	// (a bool rather than the name, so that every Secret's summary is the same and stored once).
	NamespaceIsName bool   `json:"namespaceIsName,omitempty"`
	Server          string `json:"server,omitempty"` // "" when the kubeconfig does not parse
}

// credentialsOf reads a credentials Secret, whole (as written, or read from the API server) or
// summarized (as the cache holds it).
func credentialsOf(s *corev1.Secret) credentials {
	if b, ok := s.Data[keySummary]; ok {
		var c credentials
		_ = json.Unmarshal(b, &c) // our own encoding; a zero value reads as stale
		return c
	}
	c := credentials{
		HasToken: len(s.Data[keyToken]) > 0, HasKubeconfig: len(s.Data[keyKubeconfig]) > 0,
		CADigest: digest(s.Data[keyCA]), NamespaceIsName: s.Name != "" && string(s.Data[keyNamespace]) == s.Name,
	}
	if c.HasKubeconfig {
		c.Server, _ = kubeconfig.Server(s.Data[keyKubeconfig])
	}
	return c
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// summarizeCredentials is the cache's transform of credentials Secrets: their data (a kubeconfig,
// a token and the CA, about 6 KB each) becomes the few facts the drift check reads, the same for
// every Secret in good order, so it and the labels are stored once for all of them (cachemeta).
// A thousand served requests hold kilobytes of Secrets in memory rather than megabytes. (It also
// drops managedFields, as the manager's default transform does for every other kind.)
func summarizeCredentials(obj any) (any, error) {
	obj, err := cachemeta.Transform(obj)
	s, ok := obj.(*corev1.Secret)
	if !ok || err != nil || s.Data == nil || s.Labels[nsrequest.LabelManagedBy] != nsrequest.ManagedByValue {
		return obj, err // not a credentials Secret (a source of the copies is kept whole)
	}
	if _, done := s.Data[keySummary]; done {
		return s, nil
	}
	b, err := json.Marshal(credentialsOf(s))
	if err != nil {
		return nil, err
	}
	s.Data = summaries.Share(&s.ObjectMeta, cachemeta.HashBytes(b), map[string][]byte{keySummary: b})
	cachemeta.ShareMaps(&s.ObjectMeta)
	return s, nil
}

// summaries are the cached Secrets' data, each summary stored once.
var summaries = cachemeta.NewShared(func(a, b map[string][]byte) bool {
	return bytes.Equal(a[keySummary], b[keySummary])
})
