#!/usr/bin/env python3
"""Drives the session viewer of a running `podhost serve` in a real browser (Debian's chromium,
headless, through chromedriver and Selenium's WebDriver client), as tests/byoh/viewer_browser.rs
asks: a wrong credential refused, sign-in, the list, a session with a command's output, hostile
text rendered inert, a running session's row turning `completed` and a session submitted
after the list loaded appearing on it, both without a reload.

Talks to its caller on stdin/stdout, one line at a time: prints `watching` once the running
session's row is on screen, waits for a line (the caller released the turn and submitted the
new session), and prints `ok`
at the end. Any failed check exits 1 with the reason on stderr. Screenshots go to --shots.
"""

import argparse
import os
import sys

from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

WAIT = 15


def fail(why):
    print(why, file=sys.stderr, flush=True)
    sys.exit(1)


def check(ok, why):
    if not ok:
        fail(why)


def no_alert(driver, where):
    try:
        text = driver.switch_to.alert.text
    except NoAlertPresentException:
        return
    fail(f"an alert opened on {where}: {text!r}")


def browser(args):
    opts = webdriver.ChromeOptions()
    opts.binary_location = args.chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--disable-gpu", "--window-size=1280,900", "--no-first-run"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=args.chromedriver), options=opts)


def status_of(driver, invocation):
    for row in driver.find_elements(By.CSS_SELECTOR, "#sessions tbody tr"):
        if row.get_attribute("data-id") == invocation:
            return row.find_element(By.CSS_SELECTOR, '[data-f="status"]').text
    return None


def sign_in(driver, args):
    driver.get(args.url + "/ui/")
    check(driver.current_url.endswith("/ui/signin"), f"not sent to sign in: {driver.current_url}")
    box = driver.find_element(By.ID, "credential")
    box.send_keys("not-the-credential")
    driver.find_element(By.CSS_SELECTOR, "#signin button").click()
    result = driver.find_element(By.ID, "signin-result")
    WebDriverWait(driver, WAIT).until(lambda d: result.text != "")
    check(result.text == "the credential is wrong", f"wrong credential answered {result.text!r}")
    check(driver.current_url.endswith("/ui/signin"), "a wrong credential left the sign-in page")
    box.clear()
    box.send_keys(args.token)
    driver.find_element(By.CSS_SELECTOR, "#signin button").click()
    WebDriverWait(driver, WAIT).until(lambda d: d.current_url.endswith("/ui/"))


def session_page(driver, args):
    driver.find_element(By.LINK_TEXT, args.done).click()
    WebDriverWait(driver, WAIT).until(lambda d: "/ui/session" in d.current_url)
    no_alert(driver, "the session page")
    text = driver.find_element(By.TAG_NAME, "main").text
    check(args.marker in text, "the command's output is not on the session page")
    check("exit code 0" in text, "the command's exit code is not on the session page")
    for hostile in ("main img", "main script", "main a[href^='javascript']", "main [onerror]"):
        found = driver.find_elements(By.CSS_SELECTOR, hostile)
        check(not found, f"the transcript made elements: {hostile}")
    driver.save_screenshot(os.path.join(args.shots, "viewer-session.png"))


def watch(driver, args):
    driver.get(args.url + "/ui/")
    check(status_of(driver, args.running) == "running", "the running session is not running")
    # A reload would lose this mark: the row must change in place.
    driver.execute_script("window.podhostMark = 'kept';")
    print("watching", flush=True)
    sys.stdin.readline()
    WebDriverWait(driver, WAIT).until(lambda d: status_of(d, args.running) == "completed")
    # The session submitted after the page loaded appears, newest, at the top, with its link.
    WebDriverWait(driver, WAIT).until(lambda d: status_of(d, args.new) == "completed")
    first = driver.find_element(By.CSS_SELECTOR, "#sessions tbody tr")
    check(first.get_attribute("data-id") == args.new, "the new session is not the first row")
    link = first.find_element(By.TAG_NAME, "a").get_attribute("href")
    check(link.endswith("/ui/session?id=" + args.new), f"the new row links to {link}")
    mark = driver.execute_script("return window.podhostMark;")
    check(mark == "kept", "the page reloaded to show the new status")
    driver.save_screenshot(os.path.join(args.shots, "viewer-list.png"))
    # On a phone's width the page is as readable: nothing wider than the screen but the table,
    # which scrolls in its own box.
    driver.set_window_size(390, 844)
    wide = driver.execute_script("return document.documentElement.scrollWidth;")
    seen = driver.execute_script("return document.documentElement.clientWidth;")
    check(wide <= seen, f"the page is {wide} px wide on a {seen} px screen")
    driver.save_screenshot(os.path.join(args.shots, "viewer-phone.png"))


def main():
    p = argparse.ArgumentParser()
    names = ("url", "token", "done", "running", "new", "marker", "shots", "chromium",
             "chromedriver")
    for name in names:
        p.add_argument("--" + name, required=True)
    args = p.parse_args()
    os.makedirs(args.shots, exist_ok=True)
    driver = browser(args)
    try:
        sign_in(driver, args)
        no_alert(driver, "the list")
        check(status_of(driver, args.done) == "completed", "the finished session is not listed")
        session_page(driver, args)
        watch(driver, args)
        no_alert(driver, "the list")
    finally:
        driver.quit()
    print("ok", flush=True)


if __name__ == "__main__":
    main()
