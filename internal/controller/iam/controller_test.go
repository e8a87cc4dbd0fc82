package iam

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestEKSClusterNameFlag: --eks-cluster-name defaults to --cluster-name; a bad explicit value stops
// the controller naming the flag; a --cluster-name that is no EKS name only keeps Pod Identity
// objects from running, with a message saying to set the flag.
func TestEKSClusterNameFlag(t *testing.T) {
	t.Parallel()
	base := Options{ClusterName: "prod", OIDCIssuer: "https://oidc.example.com/id/X", Partition: "aws", Resync: time.Hour, Concurrency: 1}
	for _, tc := range []struct {
		cluster, eks string
		want         string // the EKS cluster used
		startErr     string // the controller does not start
		objectErr    string // Pod Identity objects stall
	}{
		{cluster: "prod", want: "prod"},
		{cluster: "prod", eks: "prod-eks_1", want: "prod-eks_1"},
		{cluster: "prod", eks: "prod.eu", startErr: `--eks-cluster-name "prod.eu" is not an EKS cluster name`},
		{cluster: "prod.eu", want: "prod.eu", objectErr: `--cluster-name "prod.eu" is not an EKS cluster name`},
		{cluster: "prod.eu", eks: "prod-eu", want: "prod-eu"},
	} {
		o := base
		o.ClusterName, o.EKSClusterName = tc.cluster, tc.eks
		cfg, err := o.validate()
		if tc.startErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.startErr) {
				t.Errorf("%+v: error %v, want %q", tc, err, tc.startErr)
			}
			continue
		}
		if err != nil || cfg.eksCluster != tc.want {
			t.Errorf("%+v: eksCluster %q, error %v", tc, cfg.eksCluster, err)
			continue
		}
		if tc.objectErr == "" && cfg.eksClusterErr != nil ||
			tc.objectErr != "" && (cfg.eksClusterErr == nil || !strings.Contains(cfg.eksClusterErr.Error(), tc.objectErr) || !strings.Contains(cfg.eksClusterErr.Error(), "set --eks-cluster-name")) {
			t.Errorf("%+v: eksClusterErr %v, want %q", tc, cfg.eksClusterErr, tc.objectErr)
		}
	}
}

// TestOIDCIssuerFlag: --oidc-issuer is optional (a Pod Identity-only cluster has no OIDC provider
// to trust); when set it is normalized, and a bad value stops the controller naming the flag.
func TestOIDCIssuerFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		issuer, want, startErr string
	}{
		{issuer: "", want: ""},
		{issuer: "https://oidc.eks.eu-west-1.amazonaws.com/id/ABC/", want: "oidc.eks.eu-west-1.amazonaws.com/id/ABC"},
		{issuer: "oidc.example.com/id/X", want: "oidc.example.com/id/X"},
		{issuer: "http://oidc.example.com", startErr: "--oidc-issuer: the OIDC issuer URL must use https"},
		{issuer: " ", startErr: "--oidc-issuer: the OIDC issuer URL is empty"},
	} {
		o := Options{ClusterName: "prod", OIDCIssuer: tc.issuer, Partition: "aws", Resync: time.Hour, Concurrency: 1}
		cfg, err := o.validate()
		switch {
		case tc.startErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.startErr) {
				t.Errorf("%q: error %v, want %q", tc.issuer, err, tc.startErr)
			}
		case err != nil || cfg.issuer != tc.want:
			t.Errorf("%q: issuer %q, error %v; want %q", tc.issuer, cfg.issuer, err, tc.want)
		}
	}
}

// TestSharedRoleNamespacesFlag: --iam-shared-role-namespaces is a comma list of namespace names
// and * patterns; anything else stops the controller naming the flag and the value.
func TestSharedRoleNamespacesFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		value    string
		want     []string
		startErr string
	}{
		{value: "", want: nil},
		{value: "platform, team-*, *-shared", want: []string{"platform", "team-*", "*-shared"}},
		{value: "team/a", startErr: `--iam-shared-role-namespaces: "team/a" is not a namespace name`},
		{value: "Team", startErr: `"Team" is not a namespace name`},
		{value: "team-[ab]", startErr: `"team-[ab]" is not a namespace name`},
	} {
		o := Options{ClusterName: "prod", Partition: "aws", Resync: time.Hour, Concurrency: 1, SharedRoleNamespaces: tc.value}
		cfg, err := o.validate()
		switch {
		case tc.startErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.startErr) {
				t.Errorf("%q: error %v, want %q", tc.value, err, tc.startErr)
			}
		case err != nil || !slices.Equal(cfg.sharedNamespaces, tc.want):
			t.Errorf("%q: %q, error %v; want %q", tc.value, cfg.sharedNamespaces, err, tc.want)
		}
	}
}
