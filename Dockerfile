# The manager image: a static binary on distroless, running as the nonroot user (65532).
# Build where a Docker engine runs:  docker build -t <registry>/quartermaster:<tag> .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY internal/ internal/
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/quartermaster ./cmd/quartermaster

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/quartermaster /quartermaster
USER 65532:65532
ENTRYPOINT ["/quartermaster"]
