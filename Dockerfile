# syntax=docker/dockerfile:1
#
# Typed Decision Service: the gateway as a container image (see docs/deployment.md).
#
#   docker build -t typed-decision-service .                          # with the in-process engine
#   docker build -t typed-decision-service --build-arg WITH_ENGINE=false .   # external model services only
#   docker run -d -p 8080:8080 -v tds-data:/data \
#     -v "$PWD/secrets/metrics_token:/run/secrets/metrics_token:ro" \
#     -e TDS_METRICS_TOKEN_FILE=/run/secrets/metrics_token \
#     -e TDS_MODEL_SERVICE_URL=http://models.internal:11434 typed-decision-service
#
# HOST is 0.0.0.0 here, so the server refuses to start without TDS_METRICS_TOKEN or TDS_METRICS_TOKEN_FILE
# (GET /metrics would otherwise be open to the network). Every secret setting has a *_FILE variant.

# Node.js 24 (LTS); the gateway itself supports Node.js 20 and later.
ARG NODE_IMAGE=node:24-bookworm-slim

# --- build: compile src/ to dist/ (TypeScript and the other dev dependencies live only here) ----------
FROM ${NODE_IMAGE} AS build
WORKDIR /src
COPY package.json package-lock.json ./
# --ignore-scripts: `prepare` would compile before src/ is copied; nothing native is needed to compile.
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY scripts/build.mjs ./scripts/build.mjs
COPY src ./src
RUN npm run build && test -f dist/server.js && test -d dist/store/migrations

# --- deps: production node_modules, with a compiler for better-sqlite3 when no prebuilt binary fits ----
FROM ${NODE_IMAGE} AS deps
# true: include node-llama-cpp (the in-process engine, ~70 MB); false: --omit=optional, external model
# services (TDS_MODEL_SERVICE_URL or the config file's model_services) only.
ARG WITH_ENGINE=true
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY package.json package-lock.json ./
COPY scripts/build.mjs ./scripts/build.mjs
# The same packages as `npm ci --omit=dev` of docs/deployment.md. Scripts are run explicitly: the only
# install scripts in the production tree are better-sqlite3's (rebuilt below: prebuilt binary, else
# node-gyp) and node-llama-cpp's (skipped by package.json config anyway); the root's `prepare` has
# nothing to build here (dist/ comes from the build stage).
RUN case "$WITH_ENGINE" in \
      true) omit="" ;; \
      false) omit="--omit=optional" ;; \
      *) echo "WITH_ENGINE must be true or false (got '$WITH_ENGINE')" >&2; exit 1 ;; \
    esac \
 && npm ci --omit=dev $omit --ignore-scripts --no-audit --no-fund \
 && npm rebuild better-sqlite3 \
 && node -e "new (require('better-sqlite3'))(':memory:').close()" \
 && if [ "$WITH_ENGINE" = true ]; then node --input-type=module -e "await import('node-llama-cpp')"; fi \
 && npm cache clean --force

# --- runtime ---------------------------------------------------------------------------------------------
FROM ${NODE_IMAGE} AS runtime
LABEL org.opencontainers.image.title="Typed Decision Service" \
      org.opencontainers.image.description="Self-hostable gateway for System One typed decisions" \
      org.opencontainers.image.licenses="Apache-2.0"
WORKDIR /app
COPY --from=deps /app/node_modules ./node_modules
COPY --from=build /src/dist ./dist
COPY package.json package-lock.json LICENSE ./
COPY bin ./bin
COPY web ./web
# /data: the SQLite database, the downloaded models and the bootstrap key file; owned by the
# unprivileged `node` user (uid 1000) of the base image. Mount a named volume there (-v tds-data:/data):
# a new named volume takes this owner and mode.
RUN mkdir -p /data \
 && chown node:node /data \
 && chmod 0700 /data \
 && chmod 0755 bin/tds.mjs \
 && ln -s /app/bin/tds.mjs /usr/local/bin/tds

ENV HOST=0.0.0.0 \
    PORT=8080 \
    TDS_DATABASE_URL=sqlite:/data/tds.sqlite \
    TDS_MODEL_CACHE_DIR=/data/models \
    TDS_BOOTSTRAP_KEY_FILE=/data/bootstrap-key.txt

VOLUME /data
USER node
EXPOSE 8080
STOPSIGNAL SIGTERM
# Liveness: /healthz answers 200 while the process is up. Readiness (/readyz: the database and the models
# too) is for load balancers and orchestrators; compose.yaml uses it. Node's fetch: the slim image has no curl.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:' + (process.env.PORT || 8080) + '/healthz', { signal: AbortSignal.timeout(4000) }).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
CMD ["node", "dist/server.js"]
