/** Page sizes of the api's lists (boxes, operations, events): `max_results` 0 or unset takes
 *  the default; more than the maximum is refused by each route's schema. */
export const DEFAULT_PAGE = 100;
export const MAX_PAGE = 1000;
