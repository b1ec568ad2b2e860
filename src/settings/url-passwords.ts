/**
 * A URL as a configuration message may show it: the password in its user part (everything between the user name's
 * colon and the last `@` of the authority, so also one that was not percent-encoded) and `password=` parameters
 * become `***`. It works on text that is not a valid URL too, which is when the message shows it.
 */
export function withoutPassword(text: string): string {
  let out = text.replace(/(password=)[^&#\s]*/gi, "$1***");
  const scheme = /^[a-z][a-z0-9+.-]*:\/\//i.exec(out);
  if (scheme) {
    const rest = out.slice(scheme[0].length);
    const at = rest.lastIndexOf("@");
    const colon = rest.indexOf(":");
    if (at > 0 && colon >= 0 && colon < at) out = `${scheme[0]}${rest.slice(0, colon)}:***${rest.slice(at)}`;
  }
  return out;
}

/** True when a URL holds a password (in its user part or a `password=` parameter). */
export function urlHasPassword(text: string): boolean {
  try {
    const url = new URL(text);
    return url.password !== "" || url.searchParams.has("password");
  } catch {
    return false;
  }
}
