# A static gitcanary on a distroless base: docker build -t gitcanary .
FROM rust:1.95-alpine3.22 AS build
# musl toolchain, libgit2's and aws-lc's build tools, OpenSSL to link statically.
RUN apk add --no-cache musl-dev cmake make perl pkgconf openssl-dev openssl-libs-static
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
ENV OPENSSL_STATIC=1
RUN cargo build --release --locked --bin gitcanary \
    && strip target/release/gitcanary

# kustomize and helm for Kustomize and Helm apps, at the versions scripts/renderers.env pins.
FROM golang:1.26-alpine3.22 AS renderers
COPY scripts/renderers.env /renderers.env
RUN . /renderers.env \
    && export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -trimpath" GOBIN=/out \
    && go install -ldflags "-s -w" "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION" \
    && go install -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=renderers /out/kustomize /out/helm /usr/local/bin/
COPY --from=build /src/target/release/gitcanary /usr/local/bin/gitcanary
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/gitcanary"]
CMD ["run", "--listen=0.0.0.0:8080"]
