# Images of the project:
#   docker build --target server -t etcdbackup-server .
#   docker build --target agent  -t etcdbackup-agent .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/version.Version=${VERSION}" -o /out/ ./cmd/etcdbackup-server ./cmd/etcdbackup-agent

FROM gcr.io/distroless/static-debian12:nonroot AS server
COPY --from=build /out/etcdbackup-server /etcdbackup-server
USER 65532:65532
ENTRYPOINT ["/etcdbackup-server"]

FROM gcr.io/distroless/static-debian12:nonroot AS agent
COPY --from=build /out/etcdbackup-agent /etcdbackup-agent
USER 65532:65532
ENTRYPOINT ["/etcdbackup-agent"]
