// Package chart renders the Helm chart charts/quartermaster with helm (either testenv.Helm) for
// the chart's tests and the e2e install, and turns the rendered manager Deployment into the process a
// kubelet would run (kwok runs no containers).
package chart

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// Dir is the chart's folder, relative to the repository's top folder.
const Dir = "charts/quartermaster"

// Template runs `helm template RELEASE charts/quartermaster --namespace NAMESPACE` with extra
// arguments (-f FILE, --set K=V) with the given Helm and returns the manifest.
func Template(h testenv.Helm, release, namespace string, extra ...string) ([]byte, error) {
	return h.Run(append([]string{"template", release, Dir, "--namespace", namespace}, extra...)...)
}

// Objects splits a rendered manifest into its objects, in order.
func Objects(manifest []byte) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	for {
		doc, err := dec.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		obj := map[string]any{}
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, fmt.Errorf("%w in\n%s", err, doc)
		}
		if len(obj) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: obj})
	}
}

// Find returns the object of that kind and name (any namespace), or nil.
func Find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	i := slices.IndexFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == kind && o.GetName() == name })
	if i < 0 {
		return nil
	}
	return objs[i]
}

// Names lists "Kind namespace/name" of every object, for messages and set comparisons.
func Names(objs []*unstructured.Unstructured) []string {
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName())
	}
	return out
}
