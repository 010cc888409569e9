"""The operator console: the pages, forms and live feed a human operator uses to watch the hub,
decide holds and set policy. Reads go through `console.selectors`, changes through the services of
the apps below; the Django project that serves it is `hub`."""
