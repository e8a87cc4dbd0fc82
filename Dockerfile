# The manager image: a static binary on distroless, running as the nonroot user (65532).
# Build where a Docker engine runs:  docker build -t <registry>/quartermaster:<tag> .
# Without a Docker engine, `make image` (hack/image) builds the equivalent image: the same build
# flags, user, entrypoint, working folder, environment, distroless's users and Debian's CA
# certificates (not distroless's tzdata and Debian base files), as a reproducible linux/amd64 +
# linux/arm64 index. Keep the two consistent: a change here is a change in hack/image/main.go.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY internal/ internal/
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags="-s -w -buildid=" -o /out/quartermaster ./cmd/quartermaster

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/quartermaster /quartermaster
USER 65532:65532
ENTRYPOINT ["/quartermaster"]
