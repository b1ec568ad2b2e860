/** The page sizes of every listing (organizations, API keys' audit, usage records): the API, the store and the CLI. */

/** The most entries one page holds: the API's `limit`, the store's page queries and the CLI's requests. */
export const MAX_PAGE_LIMIT = 200;

/** The page size of the API when `limit` is absent. */
export const DEFAULT_PAGE_LIMIT = 50;
