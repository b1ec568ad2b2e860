// The API reference page: reads the gateway's OpenAPI document (../openapi.json, relative so that it
// also works under a proxy's path prefix) and renders it with DOM calls only.

import { $, appendChildren, clear, h } from "../console/dom.js";
import { richText, schemaSummary, schemaView } from "./schema-view.js";

const METHODS = ["get", "put", "post", "patch", "delete", "options", "head", "trace"];

function paragraphs(text, className) {
  if (!text) return [];
  return String(text)
    .split(/\n\s*\n/)
    .map((p) => h("p", { class: className }, richText(p.trim())));
}

function slug(text) {
  return String(text)
    .toLowerCase()
    .replace(/[^a-z0-9_]+/g, "-")
    .replace(/^-+|-+$/g, "");
}

/** Hands out ids that are unique on the page. */
function idMaker() {
  const used = new Set();
  return (base) => {
    let id = base || "section";
    for (let n = 2; used.has(id); n++) id = `${base}-${n}`;
    used.add(id);
    return id;
  };
}

/** Every operation in document order, with the path item's parameters merged in (the operation's win). */
function operationsOf(doc) {
  const ops = [];
  for (const [path, item] of Object.entries(doc.paths ?? {})) {
    for (const method of METHODS) {
      const op = item?.[method];
      if (!op) continue;
      const own = op.parameters ?? [];
      const inherited = (item.parameters ?? []).filter((p) => !own.some((o) => o.name === p.name && o.in === p.in));
      ops.push({ path, method, op, parameters: [...inherited, ...own], security: op.security ?? doc.security ?? [] });
    }
  }
  return ops;
}

/** "/admin/v1/keys/{id}" → "/admin/v1": the segments up to the first version segment, else the first one. */
function pathPrefix(path) {
  const segments = path.split("/").filter(Boolean);
  const version = segments.findIndex((s) => /^v\d+$/.test(s));
  return `/${segments.slice(0, version >= 0 ? version + 1 : 1).join("/")}`;
}

/** Groups by the first tag when the document tags its operations, otherwise by path prefix. */
function groupOperations(doc, ops) {
  const tagged = ops.some((o) => o.op.tags?.length);
  const tagInfo = new Map((doc.tags ?? []).map((t) => [t.name, t]));
  const groups = new Map();
  for (const o of ops) {
    const name = tagged ? (o.op.tags?.[0] ?? "Other") : pathPrefix(o.path);
    if (!groups.has(name)) groups.set(name, { name, description: tagInfo.get(name)?.description ?? null, ops: [] });
    groups.get(name).ops.push(o);
  }
  return [...groups.values()];
}

const schemeNames = (security) => [...new Set(security.flatMap((requirement) => Object.keys(requirement)))];

function methodBadge(method) {
  return h("span", { class: ["method", `method-${method}`], text: method.toUpperCase() });
}

function securityLine(security, schemes) {
  const names = schemeNames(security);
  if (names.length === 0) return h("p", { class: "op-auth" }, "Authentication: none");
  return h(
    "p",
    { class: "op-auth" },
    "Authentication: ",
    names.flatMap((name, i) => [i ? " or " : "", schemes[name] ? h("a", { href: `#security-${slug(name)}`, text: name }) : name]),
  );
}

/** How a client presents the credentials of a security scheme. */
function schemeUsage(scheme) {
  const code = (text) => h("code", { text });
  if (scheme.type === "http" && scheme.scheme?.toLowerCase() === "bearer")
    return ["Send the header ", code("Authorization: Bearer <token>")];
  if (scheme.type === "http") return [`HTTP ${scheme.scheme ?? ""} authentication`];
  if (scheme.type === "apiKey") return [`An API key in the ${scheme.in} `, code(scheme.name ?? "")];
  return [`Type ${scheme.type ?? "unknown"}`];
}

function securitySection(doc, ops, groups) {
  const schemes = doc.components?.securitySchemes ?? {};
  const entries = Object.entries(schemes);
  return h(
    "section",
    { id: "security", class: "docs-section", "aria-labelledby": "security-title" },
    h("h2", { id: "security-title", text: "Authentication" }),
    entries.length === 0 ? h("p", { class: "muted", text: "The document declares no security schemes." }) : null,
    h(
      "div",
      { class: "schemes" },
      entries.map(([name, scheme]) => {
        const users = ops.filter((o) => schemeNames(o.security).includes(name));
        const prefixes = [...new Set(users.map((o) => groups.find((g) => g.ops.includes(o)).name))];
        return h(
          "article",
          { class: "panel scheme", id: `security-${slug(name)}`, "aria-labelledby": `security-${slug(name)}-title` },
          h("h3", { id: `security-${slug(name)}-title` }, h("code", { text: name })),
          paragraphs(scheme.description, "scheme-description"),
          h("p", { class: "muted" }, schemeUsage(scheme)),
          h(
            "p",
            null,
            users.length === 0
              ? "Used by no operation."
              : `Used by ${users.length} operation${users.length === 1 ? "" : "s"} in ${prefixes.join(", ")}.`,
          ),
        );
      }),
    ),
  );
}

function parametersBlock(parameters, doc) {
  if (parameters.length === 0) return null;
  return h(
    "section",
    { class: "op-part" },
    h("h4", { text: "Parameters" }),
    h(
      "ul",
      { class: "schema-fields params" },
      parameters.map((p) => {
        const s = schemaSummary(p.schema ?? {}, doc);
        return h(
          "li",
          { class: "field" },
          h(
            "div",
            { class: "field-head" },
            h("code", { class: "field-name", text: p.name }),
            h("span", { class: "param-in", text: `in ${p.in}` }),
            s.type ? h("span", { class: "field-type", text: s.type }) : null,
            p.required ? h("span", { class: "field-required", text: "required" }) : null,
            p.deprecated ? h("span", { class: "field-required", text: "deprecated" }) : null,
          ),
          s.facts,
          paragraphs(p.description ?? s.description, "field-description"),
          s.examples,
        );
      }),
    ),
  );
}

function mediaExamples(media) {
  const values = [];
  if (media.example !== undefined) values.push({ label: "Example", value: media.example });
  for (const [name, example] of Object.entries(media.examples ?? {})) {
    if (example?.value !== undefined) values.push({ label: `Example: ${example.summary ?? name}`, value: example.value });
  }
  return values.map(({ label, value }) => [
    h("h5", { class: "code-title", text: label }),
    h("pre", { class: "code", tabindex: "0" }, JSON.stringify(value, null, 2)),
  ]);
}

function requestBodyBlock(body, doc) {
  if (!body) return null;
  return h(
    "section",
    { class: "op-part" },
    h("h4", { text: "Request body" }),
    paragraphs(body.description, "field-description"),
    Object.entries(body.content ?? {}).map(([type, media]) => [
      h(
        "p",
        { class: "media-type" },
        h("code", { text: type }),
        body.required ? h("span", { class: "field-required", text: "required" }) : " (optional)",
      ),
      media.schema ? schemaView(media.schema, doc, { inRequest: true }) : null,
      mediaExamples(media),
    ]),
  );
}

function statusClass(status) {
  return /^[1-5]/.test(status) ? `status-${status[0]}xx` : "status-default";
}

function responsesBlock(responses, doc) {
  const entries = Object.entries(responses ?? {});
  if (entries.length === 0) return null;
  return h(
    "section",
    { class: "op-part" },
    h("h4", { text: "Responses" }),
    h(
      "ul",
      { class: "responses" },
      entries.map(([status, response]) =>
        h(
          "li",
          { class: "response" },
          h(
            "div",
            { class: "response-head" },
            h("span", { class: ["status", statusClass(status)], text: status }),
            h("span", null, richText(response.description ?? "")),
          ),
          Object.entries(response.content ?? {}).map(([type, media]) =>
            h(
              "details",
              { class: "disclosure response-schema" },
              h("summary", null, `${type} · ${media.schema?.title ?? "schema"}`),
              media.schema ? schemaView(media.schema, doc) : null,
              mediaExamples(media),
            ),
          ),
        ),
      ),
    ),
  );
}

function operationArticle(o, id, doc) {
  const { op } = o;
  const schemes = doc.components?.securitySchemes ?? {};
  return h(
    "article",
    { class: "panel operation", id, "aria-labelledby": `${id}-title` },
    h("h3", { id: `${id}-title`, class: "op-title" }, methodBadge(o.method), " ", h("code", { class: "op-path", text: o.path })),
    op.deprecated ? h("p", { class: "field-required", text: "Deprecated" }) : null,
    op.summary ? h("p", { class: "op-summary" }, richText(op.summary)) : null,
    paragraphs(op.description, "op-description"),
    securityLine(o.security, schemes),
    parametersBlock(o.parameters, doc),
    requestBodyBlock(op.requestBody, doc),
    responsesBlock(op.responses, doc),
  );
}

function tocLink(href, ...content) {
  return h("a", { href }, content);
}

function render(doc) {
  const info = doc.info ?? {};
  const ops = operationsOf(doc);
  const groups = groupOperations(doc, ops);
  const uniqueId = idMaker();
  for (const id of ["overview", "security", "main", "toc"]) uniqueId(id);

  document.title = `API reference · ${info.title ?? "API"}`;
  $("#api-title").textContent = info.title ?? "API reference";
  const meta = [info.version ? `Version ${info.version}` : null, doc.openapi ? `OpenAPI ${doc.openapi}` : null, `${ops.length} operations`];
  $("#api-meta").textContent = meta.filter(Boolean).join(" · ");
  $("#api-description").replaceWith(...paragraphs(info.description, "api-description"));

  const tocGroups = [];
  const sections = groups.map((group) => {
    const groupId = uniqueId(`group-${slug(group.name)}`);
    const items = group.ops.map((o) => ({ o, id: uniqueId(`op-${slug(o.op.operationId ?? `${o.method}-${o.path}`)}`) }));
    tocGroups.push(
      h(
        "li",
        null,
        tocLink(`#${groupId}`, group.name),
        h(
          "ul",
          null,
          items.map(({ o, id }) =>
            h("li", null, tocLink(`#${id}`, methodBadge(o.method), " ", h("span", { class: "toc-path", text: o.path }))),
          ),
        ),
      ),
    );
    return h(
      "section",
      { id: groupId, class: "docs-section", "aria-labelledby": `${groupId}-title` },
      h("h2", { id: `${groupId}-title` }, h("code", { text: group.name })),
      paragraphs(group.description, "group-description"),
      items.map(({ o, id }) => operationArticle(o, id, doc)),
    );
  });

  appendChildren(
    clear($("#toc-list")),
    h("li", null, tocLink("#overview", "Overview")),
    h("li", null, tocLink("#security", "Authentication")),
    tocGroups,
  );
  $("#docs-content").replaceChildren(securitySection(doc, ops, groups), ...sections);
}

/** On a narrow screen the contents start folded, and fold again once a link in them is followed. */
function foldTocOnNarrowScreens() {
  const narrow = matchMedia("(max-width: 900px)");
  const details = $("#toc-details");
  details.open = !narrow.matches;
  narrow.addEventListener("change", () => (details.open = !narrow.matches));
  $("#toc-list").addEventListener("click", (event) => {
    if (narrow.matches && event.target instanceof Element && event.target.closest("a")) details.open = false;
  });
}

async function start() {
  const main = $("#main");
  foldTocOnNarrowScreens();
  try {
    const response = await fetch("../openapi.json", { headers: { accept: "application/json" } });
    if (!response.ok) throw new Error(`the gateway answered ${response.status}`);
    render(await response.json());
    // The targets did not exist when the browser tried to scroll to the URL's fragment.
    if (location.hash) document.getElementById(decodeURIComponent(location.hash.slice(1)))?.scrollIntoView();
  } catch (error) {
    $("#api-meta").textContent = "";
    const box = $("#docs-error");
    box.textContent = `Could not load the API description (openapi.json): ${error instanceof Error ? error.message : String(error)}`;
    box.hidden = false;
  } finally {
    main.removeAttribute("aria-busy");
  }
}

start();
