package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/quartermaster-dev/quartermaster/internal/cli"
	"github.com/quartermaster-dev/quartermaster/internal/nsclient"
)

func init() {
	subcommands["request"] = request
}

// requestUsage is `quartermaster request --help`, above its flags.
var requestUsage = cli.Usage{
	Command: "quartermaster request",
	Args:    "NAME | --exchange-url URL --id-token-file FILE",
	About: `Asks the namespaces controller for namespace NAME (creating the request ConfigMap NAME, or reusing
it), waits for the answer and writes the kubeconfig it hands out. Exits 0 when the namespace is
ready, 2 at once when the request is refused (Invalid or Conflict, with the controller's reason),
and 1 on a timeout or any other error. Needs only create/get/delete of ConfigMaps and get of Secrets
in the requests namespace (config/samples/namespaces/pipeline-rbac.yaml). Flags may come before or
after NAME.

Keyless (no Kubernetes credential at all): with --exchange-url and the job's OIDC identity token
(--id-token-file, or --id-token-env naming the variable that holds it), the token is exchanged at
the namespaces controller's exchange for the namespace its claims allow under a TrustedIssuer; NAME
is then left out (the name follows from the token). Exit status as above: 2 when the exchange
refuses the token or its claims, 1 when it cannot answer (try again).`,
	Examples: []string{
		"# Ask for namespace ci-pr-42 for two hours, then deploy into it with the kubeconfig it hands out\n" +
			"quartermaster request ci-pr-42 --ttl=2h --kubeconfig-out=kubeconfig && KUBECONFIG=kubeconfig kubectl apply -f deploy/",
		"# The same with the flags first, a controller watching another requests namespace, and a shorter wait\n" +
			"quartermaster request --requests-namespace team-requests --timeout 30s ci-pr-42",
		"# As a pipeline identity other than KUBECONFIG's\n" +
			"quartermaster request ci-pr-42 --kubeconfig=pipeline.kubeconfig --token-ttl=30m",
		"# Keyless, in a GitLab CI job whose id_tokens put the token in QM_ID_TOKEN\n" +
			"quartermaster request --exchange-url https://qm.example.com --id-token-env QM_ID_TOKEN --ttl 2h",
	},
}

// requestFlags reads request's command line (flags before or after the name) into the request.
// flag.ErrHelp is returned for --help, after the usage was written to out.
func requestFlags(args []string, out io.Writer) (nsclient.Request, keyless, error) {
	fs := flag.NewFlagSet("request", flag.ContinueOnError)
	fs.SetOutput(out)
	r := nsclient.Request{}
	var k keyless
	fs.StringVar(&k.url, "exchange-url", "", "keyless: the namespaces controller's exchange (https://…); the namespace follows from the identity token")
	fs.StringVar(&k.tokenFile, "id-token-file", "", "keyless: file holding the job's OIDC identity token")
	fs.StringVar(&k.tokenEnv, "id-token-env", "", "keyless: environment variable holding the job's OIDC identity token")
	fs.StringVar(&k.caFile, "exchange-ca-file", "", "keyless: the CA bundle the exchange's certificate must chain to (default: the system's)")
	fs.StringVar(&r.RequestsNamespace, "requests-namespace", "namespace-requests", "the namespace whose ConfigMaps are requests (the controller's --requests-namespace)")
	fs.DurationVar(&r.TTL, "ttl", 0, "delete the namespace this long after its creation (0: no expiry, or the operator's --max-ttl)")
	fs.DurationVar(&r.TokenTTL, "token-ttl", 0, "lifetime of the handed-out token (0: the operator's --token-ttl)")
	fs.DurationVar(&r.Timeout, "timeout", 2*time.Minute, "how long to wait for the namespace to be ready")
	fs.StringVar(&r.KubeconfigPath, "kubeconfig-out", "kubeconfig", "where to write the namespace's kubeconfig (mode 0600)")
	config.RegisterFlags(fs) // --kubeconfig: the pipeline's own identity
	names, err := cli.Parse(fs, requestUsage, args)
	if err != nil {
		return r, k, err
	}
	if k.url != "" || k.tokenFile != "" || k.tokenEnv != "" {
		switch {
		case len(names) > 0:
			return r, k, requestUsage.Errorf("a keyless request takes no NAME: the namespace follows from the identity token (got %q)", names)
		case k.url == "":
			return r, k, requestUsage.Errorf("--id-token-file or --id-token-env needs --exchange-url")
		case (k.tokenFile == "") == (k.tokenEnv == ""):
			return r, k, requestUsage.Errorf("--exchange-url needs the job's token: exactly one of --id-token-file and --id-token-env")
		}
		return r, k, nil
	}
	switch {
	case len(names) == 0:
		return r, k, requestUsage.Errorf("want exactly one argument, the namespace's name")
	case len(names) > 1:
		return r, k, requestUsage.Errorf("want exactly one argument, the namespace's name, got %q", names)
	}
	r.Name = names[0]
	return r, k, nil
}

// keyless are request's flags of the keyless path.
type keyless struct{ url, tokenFile, tokenEnv, caFile string }

// token reads the identity token from the file or variable named.
func (k keyless) token() (string, error) {
	if k.tokenEnv != "" {
		t := strings.TrimSpace(os.Getenv(k.tokenEnv))
		if t == "" {
			return "", fmt.Errorf("--id-token-env %s: the variable is empty or unset", k.tokenEnv)
		}
		return t, nil
	}
	b, err := os.ReadFile(k.tokenFile)
	if err != nil {
		return "", fmt.Errorf("--id-token-file: %w", err)
	}
	if t := strings.TrimSpace(string(b)); t != "" {
		return t, nil
	}
	return "", fmt.Errorf("--id-token-file %s is empty", k.tokenFile)
}

// request is the pipeline side of a namespace request: quartermaster request NAME.
func request(ctx context.Context, args []string) error {
	r, k, err := requestFlags(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if k.url != "" {
		token, err := k.token()
		if err != nil {
			return err
		}
		served, err := nsclient.RunExchange(ctx, nsclient.Exchange{
			URL: k.url, Token: token, CAFile: k.caFile, TTL: r.TTL, TokenTTL: r.TokenTTL, Timeout: r.Timeout, KubeconfigPath: r.KubeconfigPath,
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "namespace %s is ready; kubeconfig written to %s (token expires at %s)\n", served.Namespace, r.KubeconfigPath, served.TokenExpiresAt)
		return nil
	}
	cfg, err := config.GetConfig()
	if err != nil {
		return fmt.Errorf("no API server to talk to (use --kubeconfig or KUBECONFIG): %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		return err
	}
	served, err := nsclient.Run(ctx, c, r, os.Stderr)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "namespace %s is ready; kubeconfig written to %s (token expires at %s)\n", served.Namespace, r.KubeconfigPath, served.TokenExpiresAt)
	return nil
}
