/* Symbol export macro for the moeinfer C ABI.
 *
 * The library is built with hidden visibility; only declarations marked MOE_API are
 * exported (and the version script cmake/moeinfer.map additionally limits exports to moe_*).
 * Define MOEINFER_STATIC when linking the static library on Windows. */
#ifndef MOEINFER_EXPORT_H
#define MOEINFER_EXPORT_H

#if defined(_WIN32) || defined(__CYGWIN__)
#  if defined(MOEINFER_STATIC)
#    define MOE_API
#  elif defined(MOEINFER_BUILDING)
#    define MOE_API __declspec(dllexport)
#  else
#    define MOE_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) || defined(__clang__)
#  define MOE_API __attribute__((visibility("default")))
#else
#  define MOE_API
#endif

#endif /* MOEINFER_EXPORT_H */
