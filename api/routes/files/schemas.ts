import Joi from 'joi';
import { boxParams } from '../boxes/schemas';

export { boxParams };
export type { BoxParams } from '../boxes/schemas';

/** `?path=`: absolute, in the box (DESIGN.md §4 "Files"). */
export const pathQuery = Joi.string().pattern(/^\//).max(4096).required().messages({ 'string.pattern.base': 'must be an absolute path' });

export const fileStatSchema = Joi.object({
  name: Joi.string().allow(''),
  path: Joi.string(),
  type: Joi.valid('file', 'dir', 'symlink', 'other'),
  size: Joi.number().integer().min(0),
  mode: Joi.string().pattern(/^[0-7]{4}$/).description('four octal digits, with setuid/setgid/sticky ("0644", "4755")'),
  mtime: Joi.string().description('RFC 3339'),
  target: Joi.string().description('a symlink\'s target, as it is written'),
});

export const fileErrors = {
  400: { description: 'the path is not absolute, or names a directory where a file is wanted (or the reverse)' },
  404: { description: 'no such box, or no such path in it' },
  403: { description: 'permission denied in the box (a read-only bind)' },
  409: { description: 'the box is not running, or a mount point in the way is in use' },
};

/** What a write or a delete adds: /.boxhost is refused before the box is asked. */
export const fileChangeErrors = {
  ...fileErrors,
  403: { description: 'permission denied in the box (a read-only bind), or a path under /.boxhost, where the box agent is bound in' },
};
