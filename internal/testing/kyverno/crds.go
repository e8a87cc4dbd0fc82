package kyverno

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// readCRDs reads every CustomResourceDefinition in the YAML files of dir (hack/kyverno-bin.sh
// copies all of Kyverno's there: kyverno.io, policies.kyverno.io, reports.kyverno.io and
// wgpolicyk8s.io).
func readCRDs(dir string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := dec.Decode(crd); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if crd.Kind == "CustomResourceDefinition" {
				crds = append(crds, crd)
			}
		}
	}
	if len(crds) == 0 {
		return nil, fmt.Errorf("no CustomResourceDefinition in %s", dir)
	}
	return crds, nil
}

// crdEstablished says whether the API server serves the CRD (its Established condition).
func crdEstablished(ctx context.Context, c client.Client, name string) (bool, string) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
		return false, err.Error()
	}
	for _, cond := range crd.Status.Conditions {
		if cond.Type == apiextensionsv1.Established {
			return cond.Status == apiextensionsv1.ConditionTrue, cond.Message
		}
	}
	return false, "no Established condition yet"
}
