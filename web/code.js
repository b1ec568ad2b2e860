// "Show code": the Playground's request as a curl command and as TypeScript with the official SDK.
// Neither contains the key: both read it from the TDS_KEY environment variable.

import { stringify } from "./json.js";

/** Quotes text for a POSIX shell in single quotes. */
function shellQuote(text) {
  return `'${text.replace(/'/g, `'\\''`)}'`;
}

export function curlSnippet(baseUrl, body) {
  return [
    `curl -s ${baseUrl}/v1/systemone \\`,
    `  -H "Authorization: Bearer $TDS_KEY" \\`,
    `  -H "Content-Type: application/json" \\`,
    `  -d ${shellQuote(stringify(body, { indent: 2 }))}`,
  ].join("\n");
}

export function typescriptSnippet(baseUrl, body, { scoreWithOneLevel = false } = {}) {
  const literal = stringify(body, { indent: 2, js: true });
  return [
    `import { TypeSafeClient } from "@typesafe-ai/sdk";`,
    ``,
    `const client = new TypeSafeClient({ apiKey: process.env.TDS_KEY, baseURL: ${JSON.stringify(baseUrl)} });`,
    ``,
    ...(scoreWithOneLevel ? [`// Note: the SDK asks for at least two levels per score question.`] : []),
    `const { answers, usage } = await client.systemOne(${literal});`,
    `console.log(answers, usage);`,
  ].join("\n");
}
